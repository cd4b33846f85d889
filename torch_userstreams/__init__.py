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


def _register_log_name() -> None:
    """``userstreams`` as a name torch's logging knows, beside ``dynamo`` and ``inductor``:
    ``torch._logging.set_logs(modules={"userstreams": logging.DEBUG})``. (``TORCH_LOGS`` is
    read when torch is imported, before this runs, so there the module name is the one that
    works: ``TORCH_LOGS=+torch_userstreams``.)"""
    from torch._logging._internal import log_registry, register_log

    if not log_registry.is_log("userstreams"):
        register_log("userstreams", "torch_userstreams")


_register_log_name()

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
