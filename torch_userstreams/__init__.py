"""torch_userstreams: user streams and events in torch.compile, per graph and per call.

``import torch_userstreams`` patches nothing; ``install()`` (or ``with installed():``)
does. See README.md.
"""

from __future__ import annotations

from .api import current_stream, lookup, new_event, new_stream
from .errors import (
    NotCompilingError,
    PatchPointError,
    StreamHazardError,
    StreamHazardWarning,
    UnsupportedPathError,
    UnsupportedTorchError,
    UserObjectError,
    UserStreamsError,
)
from .explain import explain
from .patch.install import install, installed, is_installed, uninstall
from .stream_check import CheckReport, check

__version__ = "0.1.0"

__all__ = [
    "CheckReport",
    "NotCompilingError",
    "PatchPointError",
    "StreamHazardError",
    "StreamHazardWarning",
    "UnsupportedPathError",
    "UnsupportedTorchError",
    "UserObjectError",
    "UserStreamsError",
    "check",
    "current_stream",
    "explain",
    "install",
    "installed",
    "is_installed",
    "lookup",
    "new_event",
    "new_stream",
    "uninstall",
]
