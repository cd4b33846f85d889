"""Fake implementations for the ``streams`` ops whose native one fails.

Compiling a graph runs every op under FakeTensorMode, which needs a working fake
implementation. torch 2.11 has none for ``sync_dealloc`` and one with the wrong parameters
for ``record_stream``; ``install()`` supplies the package's exactly where the native one fails
a probe, and ``uninstall()`` puts the native one back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..fx.ops import NAMESPACE, native_op
from ..run.own_ops import no_effect_fake

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


def probe_args(name: str, tensor: torch.Tensor) -> tuple[Any, ...]:
    return tuple(tensor if a == "tensor" else a for a in PROBE_ARGS[name])


def fake_works(op: Any, name: str) -> bool:
    """Whether ``op`` (the sync op ``name``) runs under FakeTensorMode on this torch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)  # it logs the failure we are probing for
    try:
        with FakeTensorMode():
            op(*probe_args(name, torch.empty(2)))
    except Exception:
        return False
    finally:
        fake_log.setLevel(level)
    return True


def fake_impl_writes() -> list[tuple[Any, str, Any, Callable[..., None]]]:
    """(op definition, attribute, native value, ours) for each op whose fake fails its probe."""
    from torch._library.custom_ops import OPDEFS

    writes = []
    for name in PROBE_ARGS:
        op = native_op(name)  # imports the module that defines the ops
        opdef = OPDEFS.get(f"{NAMESPACE}::{name}")
        if op is None or opdef is None:
            continue
        current = vars(opdef)["_abstract_fn"]
        if current is no_effect_fake or not fake_works(op, name):
            writes.append((opdef, "_abstract_fn", current, no_effect_fake))
    return writes
