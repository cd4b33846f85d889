"""Many threads calling one compiled function: each call computes with its own inputs and
syncs its own streams, forward and backward, with both package backends.

``userstreams`` runs the graph as Inductor regions on its streams only where the streams are
an accelerator's; on the fake accelerator here, so the regions and the syncs between them
run (on CPU streams the graph is one Inductor graph without syncs).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest
import torch
from helpers import run_threads
from helpers import two_stream_step as step

from torch_userstreams.simulator import SimStream
from torch_userstreams.testing.fake_accelerator import FakeAcceleratorStream, fake_accelerator

THREADS, CALLS = 4, 300


def expected(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Value and gradients of ``step``, without streams."""
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    out = ((x * w).sin() * w + x).sum()
    out.backward()
    return out.detach(), x.grad, w.grad  # type: ignore[return-value]


@contextlib.contextmanager
def objects_on(device: str) -> Iterator[type[SimStream]]:
    if device == "cpu":
        yield SimStream
        return
    with fake_accelerator():
        yield FakeAcceleratorStream


def stream(cls: type[SimStream]) -> SimStream:
    return cls(device="cpu") if cls is SimStream else cls()


CASES = [
    ("userstreams_aot_eager", "cpu"),
    ("userstreams", "cpu"),
    ("userstreams", "accelerator"),
]


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
@pytest.mark.parametrize(("backend", "device"), CASES, ids=[f"{b}-{d}" for b, d in CASES])
def test_threads_compute_with_their_own_values_and_objects(
    backend: str, device: str, backward: bool
) -> None:
    with objects_on(device) as cls:
        compiled = torch.compile(step, backend=backend)
        # Compile here, with inputs like the threads' (two tensors, their requires_grad): the
        # threads only run it. (On torch 2.11 a compile on one thread makes Dynamo refuse to
        # run compiled code on the others: its "FX tracing" flag is process-wide.)
        warm = [torch.rand(8, requires_grad=backward) for _ in range(2)]
        out = compiled(*warm, stream(cls), stream(cls))
        if backward:
            out.backward()
        failures: list[str] = []
        lock = threading.Lock()

        def worker(index: int) -> None:
            generator = torch.Generator().manual_seed(index)
            s1, s2 = stream(cls), stream(cls)
            try:
                for call in range(CALLS):
                    x = torch.rand(8, generator=generator, requires_grad=backward)
                    w = torch.rand(8, generator=generator, requires_grad=backward)
                    out = compiled(x, w, s1, s2)
                    value, gx, gw = expected(x, w)
                    wrong = not torch.allclose(out.detach(), value)
                    if backward:
                        out.backward()
                        wrong = wrong or not (
                            torch.allclose(x.grad, gx) and torch.allclose(w.grad, gw)
                        )
                    if wrong:
                        with lock:
                            failures.append(f"thread {index} call {call}: wrong value")
                if device == "accelerator":
                    assert s2.log == [("wait_stream", s1)] * CALLS, "another call's streams"
                    assert s1.log == [("wait_stream", s2)] * CALLS, "another call's streams"
            except Exception as exc:  # every thread's failure is reported below
                with lock:
                    failures.append(f"thread {index}: {type(exc).__name__}: {exc}")

        run_threads(worker, THREADS)
    assert failures == []
