"""The sync ops compiled graphs contain: which they are, and making each one usable.

Dynamo and AOTAutograd express every stream sync as a ``streams::*`` custom op whose
integer arguments are indices into the graph's user-object table. This module is the one
place that knows those ops:

* ``is_sync_op``: whether an FX target is one of them (ours included, below);
* ``sync_op(name)``: the op to emit for a sync. torch 2.11 has no
  ``streams::synchronize_stream`` / ``synchronize_event``; there the package defines
  ``userstreams::`` ops with the same schema and meaning. Defining an op in our own
  namespace changes nothing in torch, and a graph compiled with one keeps running after
  ``uninstall()``, so they stay defined once made;
* ``fake_impl_writes()``: compiling a graph runs every op under FakeTensorMode, which
  needs a working fake implementation. torch 2.11 has none for ``sync_dealloc`` and one with
  the wrong parameters for ``record_stream``; ``install()`` supplies ours exactly where the
  native one fails a probe, and ``uninstall()`` puts the native one back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

NAMESPACE = "streams"
OWN_NAMESPACE = "userstreams"
_NAMESPACES = frozenset({NAMESPACE, OWN_NAMESPACE})

# Each op of the ``streams`` namespace, with arguments to probe its fake implementation
# ("tensor" stands for a fake tensor).
PROBE_ARGS: dict[str, tuple[Any, ...]] = {
    "fork": (0, 1),
    "join": (0, 1),
    "record_event": (0, 1),
    "wait_event": (0, 1),
    "wait_stream": (0, 1),
    "sync_dealloc": (0, 1, "tensor"),
    "record_stream": ("tensor", 0),
    "synchronize_event": (0,),
    "synchronize_stream": (0,),
    "synchronize_device": ("cpu", 0),
}
# The ops the package emits itself where torch lacks them: name -> (schema, method called
# on the looked-up object).
_OWN_OPS: dict[str, tuple[str, str]] = {
    "synchronize_stream": ("(int stream_index) -> ()", "synchronize"),
    "synchronize_event": ("(int event_index) -> ()", "synchronize"),
}
_own_lock = threading.Lock()
_own_library: list[torch.library.Library] = []


def is_sync_op(target: Any) -> bool:
    """Whether an FX node target is a stream sync op (``streams::*`` or ours)."""
    return getattr(target, "namespace", None) in _NAMESPACES


def op_name(target: Any) -> str:
    """``record_event`` for ``torch.ops.streams.record_event`` (the overload or its packet)."""
    name = getattr(target, "_opname", None) or getattr(target, "_qualified_op_name", None)
    return str(name or target).rsplit("::", 1)[-1]


def native_op(name: str) -> Any | None:
    """``torch.ops.streams.<name>.default``, or None where this torch lacks it."""
    import torch._dynamo.variables.streams  # defines the ops

    try:
        return getattr(torch.ops.streams, name).default
    except AttributeError:
        return None


def _own_op(name: str) -> Any:
    return getattr(getattr(torch.ops, OWN_NAMESPACE), name).default


def sync_op(name: str) -> Any:
    """The op that performs sync ``name`` on this torch: native, else the package's own."""
    native = native_op(name)
    if native is not None:
        return native
    if name not in _OWN_OPS:
        raise KeyError(f"torch_userstreams: this torch has no streams::{name} op")
    _define_own_ops()
    return _own_op(name)


def _define_own_ops() -> None:
    with _own_lock:
        if _own_library:
            return
        library = torch.library.Library(OWN_NAMESPACE, "DEF")
        for name, (schema, method) in _OWN_OPS.items():
            library.define(name + schema)
            library.impl(name, _calls_method_of_object(method), "CompositeExplicitAutograd")
            torch.library.register_fake(f"{OWN_NAMESPACE}::{name}", no_effect_fake, lib=library)
            torch.fx.has_side_effect(_own_op(name))
        _own_library.append(library)


def _calls_method_of_object(method: str) -> Callable[[int], None]:
    def kernel(index: int) -> None:
        from .runtime import lookup

        getattr(lookup(index), method)()

    return kernel


def no_effect_fake(*args: Any, **kwargs: Any) -> None:
    """Every sync op returns nothing and makes no tensor: its fake does nothing."""
    return None


def _opdef(name: str) -> Any | None:
    from torch._library.custom_ops import OPDEFS

    return OPDEFS.get(f"{NAMESPACE}::{name}")


def fake_works(name: str) -> bool:
    """Whether ``streams::<name>`` runs under FakeTensorMode on this torch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = native_op(name)
    if op is None:
        return False
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)  # it logs the failure we are probing for
    try:
        with FakeTensorMode():
            tensor = torch.empty(2)
            op(*(tensor if a == "tensor" else a for a in PROBE_ARGS[name]))
    except Exception:
        return False
    finally:
        fake_log.setLevel(level)
    return True


def fake_impl_writes() -> list[tuple[Any, str, Any, Callable[..., None]]]:
    """(op definition, attribute, native value, ours) for each op whose fake fails its probe.

    Requires ``torch._dynamo.variables.streams`` to be imported (it defines the ops).
    """
    writes = []
    for name in PROBE_ARGS:
        opdef = _opdef(name)
        if opdef is None:
            continue
        current = vars(opdef)["_abstract_fn"]
        if current is no_effect_fake or not fake_works(name):
            writes.append((opdef, "_abstract_fn", current, no_effect_fake))
    return writes
