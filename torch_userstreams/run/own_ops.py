"""The package's own sync ops, for torch releases that lack them.

torch 2.11 has no ``streams::synchronize_stream`` / ``synchronize_event``; the package then
emits ``userstreams::`` ops with the same schema and meaning. Defining an op in the package's
own namespace changes nothing in torch, and a graph compiled with one keeps running after
``uninstall()``, so they stay defined once made.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from ..fx.ops import OWN_NAMESPACE, native_op
from .issue_syncs import ISSUERS

# name -> schema of the ops the package defines where torch has none
_OWN_OPS = {
    "synchronize_stream": "(int stream_index) -> ()",
    "synchronize_event": "(int event_index) -> ()",
}
_lock = threading.Lock()
_library: list[torch.library.Library] = []


def no_effect_fake(*args: Any, **kwargs: Any) -> None:
    """Every sync op returns nothing and makes no tensor: its fake does nothing."""
    return None


def sync_op(name: str) -> Any:
    """The op that performs sync ``name`` on this torch: native, else the package's own."""
    native = native_op(name)
    if native is not None:
        return native
    if name not in _OWN_OPS:
        raise KeyError(f"torch_userstreams: this torch has no streams::{name} op")
    _define()
    return getattr(getattr(torch.ops, OWN_NAMESPACE), name).default


def _define() -> None:
    with _lock:
        if _library:
            return
        library = torch.library.Library(OWN_NAMESPACE, "DEF")
        for name, schema in _OWN_OPS.items():
            library.define(name + schema)
            library.impl(name, ISSUERS[name], "CompositeExplicitAutograd")
            torch.library.register_fake(f"{OWN_NAMESPACE}::{name}", no_effect_fake, lib=library)
            torch.fx.has_side_effect(getattr(getattr(torch.ops, OWN_NAMESPACE), name).default)
        _library.append(library)
