"""Small stream programs shared by the pass tests, and their eager references on CPU."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._functorch._aot_autograd.streams

from torch_userstreams.simulator import SimEvent, SimStream


def two_local_streams(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    first, second = torch.Stream(device="cpu"), torch.Stream(device="cpu")
    with first:
        a = x * w
    with second:
        b = a.sin()
    return (a + b).sum()


def nested_contexts(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    outer, inner = torch.Stream(device="cpu"), torch.Stream(device="cpu")
    with outer:
        a = x * w
        with inner:
            b = a.exp()
        c = b * w
    return c.sum()


def inplace_on_input(x: torch.Tensor, w: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    side = torch.Stream(device="cpu")
    with side:
        buf.add_(1)
        y = x * buf * w
    return y.sum()


def record_wait_across_streams(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    side = torch.Stream(device="cpu")
    main = torch.Stream(device="cpu")
    ready = torch.Event(device="cpu")
    with side:
        a = x * w
        ready.record(side)
    ready.wait(main)
    with main:
        b = a.cos() * w
    return b.sum()


def parameter_on_two_streams(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    first, second = torch.Stream(device="cpu"), torch.Stream(device="cpu")
    with first:
        a = x * w
    with second:
        b = x.sin() * w
    return (a * b).sum()


def allocated_here_used_there(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    producer, consumer = torch.Stream(device="cpu"), torch.Stream(device="cpu")
    with producer:
        t = x * w
    with consumer:
        u = t.tanh() * 2
    return (u * w).sum()


def loss_on_a_side_stream(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The whole function on one side stream: its backward reads the incoming gradient there
    and returns gradients made there, so both edges of the compiled backward need a sync.
    Nothing in it is worth recomputing: where min-cut puts a recomputed node among the
    syncs differs between torch releases."""
    side = torch.Stream(device="cpu")
    with side:
        return (x * w).sum()


def saved_view_read_elsewhere(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A view made on one stream, saved, and read by the backward on another: the backward
    frees it, so its stream waits for that read (the sync holds the saved view)."""
    made, reads = torch.Stream(device="cpu"), torch.Stream(device="cpu")
    with made:
        v = (w * 2).unsqueeze(0)
    with reads:
        out = (v * x).sin()
    return out.sum()


PROGRAMS: dict[str, Callable[..., torch.Tensor]] = {
    fn.__name__: fn
    for fn in (
        two_local_streams,
        nested_contexts,
        inplace_on_input,
        record_wait_across_streams,
        parameter_on_two_streams,
        allocated_here_used_there,
        loss_on_a_side_stream,
        saved_view_read_elsewhere,
    )
}


WRAPS_SYNCS = hasattr(torch._functorch._aot_autograd.streams, "_wrap_sync_node")


def inputs(name: str, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(4, generator=gen, requires_grad=True)
    w = torch.rand(4, generator=gen, requires_grad=True)
    extra = [torch.rand(4, generator=gen)] if name == "inplace_on_input" else []
    return [x, w, *extra]


def clone(args: list[torch.Tensor]) -> list[torch.Tensor]:
    return [a.detach().clone().requires_grad_(a.requires_grad) for a in args]


@contextlib.contextmanager
def simulated_eager() -> Iterator[None]:
    """Eager CPU events cannot record: run eager references with simulated objects."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "Event", SimEvent)
        patch.setattr(torch, "Stream", SimStream)
        yield


def eager_reference(name: str, args: list[torch.Tensor]) -> tuple[Any, list[Any]]:
    """Output and gradients of the eager run (on clones of ``args``)."""
    copies = clone(args)
    with simulated_eager():
        out = PROGRAMS[name](*copies)
    out.backward()
    return out.detach(), [c.grad for c in copies if c.requires_grad]
