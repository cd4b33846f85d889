"""Test helpers shared by several test modules."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import torch

# ``options`` that compile each graph with streams as regions on every torch (torch 2.12+
# compiles one as one call by default).
REGIONS = {"userstreams.one_call": False}


def doubled_on_a_side_stream(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    """``sin(2x)``, with ``2x`` made on ``side`` and joined to a fresh stream by an event:
    the program of the tests whose backends rewrite or replay a graph's syncs."""
    with side:
        y = x * 2
    done = torch.Event(device="cpu")
    done.record(side)
    done.wait(torch.Stream(device="cpu"))
    return y.sin()


def two_stream_step(
    x: torch.Tensor, w: torch.Tensor, s1: torch.Stream, s2: torch.Stream
) -> torch.Tensor:
    """A training step over two streams, each joined to the other: the thread and cache
    tests' program."""
    with s1:
        y = (x * w).sin()
    s2.wait_stream(s1)
    with s2:
        z = y * w + x
    s1.wait_stream(s2)
    return z.sum()


def run_threads(worker: Callable[[int], None], count: int) -> None:
    """Run ``worker(i)`` on ``count`` threads at once and wait for all of them."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# The last compiled call's binding, from conftest's spy. Only one: the spy holds it strongly,
# and tests count live objects.
LAST_BINDING: list[Any] = []


def last_binding() -> Any:
    """The binding of the compiled call that last returned (on any thread)."""
    return LAST_BINDING[0] if LAST_BINDING else None


def forget_bindings() -> None:
    """Drop the spy's references, which would keep the calls' input streams alive."""
    LAST_BINDING.clear()


def backward_events(binding: Any) -> list[Any]:
    """The objects a call created for its backward (AOTAutograd's sync events)."""
    from torch_userstreams.compile.table import Phase
    from torch_userstreams.run.binding import graph_of, objects_of

    entries = graph_of(binding).table.entries
    return [objects_of(binding)[e.index] for e in entries if e.phase is Phase.BACKWARD]


class Messages(logging.Handler):
    """Every message a logger emits while this handler is on it (tests of what is logged)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def demo_step_kernels() -> list[str]:
    """The C++ kernels one demo training step launches (forward and backward), compiled by
    ``userstreams`` on the fake accelerator, in launch order."""
    import re

    from torch._inductor.utils import run_and_get_code

    from benchmarks.accelerator_step import BATCH, DIM, model
    from torch_userstreams.demo.model import ForwardAndLoss
    from torch_userstreams.patch.install import session
    from torch_userstreams.testing.capture import no_compile_caches
    from torch_userstreams.testing.fake_accelerator import fake_accelerator

    torch._dynamo.reset()
    with session(), fake_accelerator(gpu_semantics=True), no_compile_caches():
        net = model(streams=True)
        loss_of = torch.compile(ForwardAndLoss(net), backend="userstreams")
        x, y = torch.randn(BATCH, DIM), torch.randn(BATCH, 1)
        _, code = run_and_get_code(lambda: loss_of(x, y).backward())
    torch._dynamo.reset()
    return re.findall(r"^\s+(cpp_fused_\w+)\(", "\n".join(code), re.MULTILINE)
