"""The functions every CPU benchmark compiles. Imports only torch (see ``pristine``).

(a) has no user objects, so the package must cost nothing; (b) creates a stream and an
event per call, the case native keeps alive forever; (c) reads two input streams.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch


def stream_free(x: torch.Tensor) -> torch.Tensor:
    """(a): a graph with no user objects."""
    return x + 1


def creates_two(x: torch.Tensor) -> torch.Tensor:
    """(b): two graph-created objects per call; the event is created but never recorded,
    because native CPU events cannot record()."""
    stream = torch.Stream(device="cpu")
    event = torch.Event(device="cpu")  # noqa: F841 - creating it is what is measured
    with stream:
        y = x + 1
    return y


def two_inputs(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
    """(c): two user streams passed in by the caller."""
    with s1:
        y = x + 1
    with s2:
        z = y * 2
    return z


Workload = tuple[str, Callable[..., Any], tuple[Any, ...]]


def fresh_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its own code object, so Dynamo compiles and caches it separately."""
    return types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__)


def cpu_workloads() -> list[Workload]:
    """(name, function, args) for (a), (b), (c), on small tensors so overhead dominates."""
    x = torch.ones(4)
    s1 = torch.Stream(device="cpu")
    s2 = torch.Stream(device="cpu")
    return [
        ("a: x + 1, no streams", stream_free, (x,)),
        ("b: creates stream+event", creates_two, (x,)),
        ("c: two input streams", two_inputs, (x, s1, s2)),
    ]
