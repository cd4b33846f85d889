"""On an accelerator Dynamo registers the ambient current stream for every frame.

We emit it only when the graph reads it: a stream-free graph gets no prologue. The machine
has no accelerator, so these tests make torch believe it has one
(``torch_userstreams.testing.fake_accelerator``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import torch_userstreams
from torch_userstreams.compile.table import EntryKind
from torch_userstreams.testing import capture, check_stream_safety
from torch_userstreams.testing.fake_accelerator import (
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)
from torch_userstreams.testing.mutations import syncs


@pytest.fixture
def accelerator() -> Iterator[FakeAcceleratorStream]:
    with fake_accelerator() as ambient:
        yield ambient


@pytest.mark.usefixtures("installed", "accelerator")
def test_stream_free_graph_pays_no_prologue_on_an_accelerator() -> None:
    report = torch_userstreams.explain(lambda x: x + 1, torch.ones(1))
    assert report.tables == []
    assert torch.equal(report.result, torch.full((1,), 2.0))


@pytest.mark.usefixtures("installed", "accelerator")
def test_ambient_stream_is_loaded_when_the_graph_reads_it() -> None:
    def record_on_current(x: torch.Tensor) -> torch.Tensor:
        done = torch.Event(device="cpu")
        done.record()  # on the ambient current stream
        return x + 1

    report = torch_userstreams.explain(record_on_current, torch.ones(1))
    (table,) = report.tables
    # torch >= 2.12 registers the ambient stream first (index 0); 2.11 when it is read.
    assert sorted((e.kind.value, table.loads(e.index)) for e in table.entries) == [
        (EntryKind.CURRENT_STREAM.value, True),
        (EntryKind.GRAPH_CREATED.value, True),
    ]
    assert "get_current_stream" in table.prologue_listing


def waits_on_current(x: torch.Tensor, event: torch.Event, side: torch.Stream) -> torch.Tensor:
    event.record()
    side.wait_stream(torch.accelerator.current_stream())
    return x.sin()


@pytest.mark.usefixtures("installed")
def test_each_fake_accelerator_context_guards_on_its_own_current_stream() -> None:
    """Dynamo fills its guards' helpers once per process; the second context's guards read
    the first context's stream and failed on the frame that made them (torch <= 2.14)."""
    for _ in range(2):
        with fake_accelerator() as ambient:
            torch._dynamo.reset()
            event, side = FakeAcceleratorEvent(), FakeAcceleratorStream()
            torch.compile(waits_on_current, backend="userstreams")(torch.ones(2), event, side)
            assert (event.log, side.log) == ([("record", ambient)], [("wait_stream", ambient)])


def fork_join_on_the_current_stream(x: torch.Tensor) -> torch.Tensor:
    """The usual spelling of a fork and a join: record() and wait() with no stream."""
    side = torch.Stream(device="cpu")
    ready, done = torch.Event(device="cpu"), torch.Event(device="cpu")
    ready.record()
    ready.wait(side)
    with side:
        y = torch.tanh(x) * 2
    done.record(side)
    done.wait()
    return y + x.sin()


@pytest.mark.skipif(
    torch.accelerator.is_available(),
    reason="with an accelerator, Dynamo's own stack starts with its current stream",
)
@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["eager", "userstreams_aot_eager", "userstreams"])
def test_record_and_wait_with_no_stream_use_the_cpu_current_stream(backend: str) -> None:
    """Without an accelerator Dynamo's stack of entered streams is empty outside a ``with``
    block: tracing ``event.record()`` or ``event.wait()`` raised ``IndexError: deque index
    out of range``. They now sync with the graph's CPU current-stream entry."""
    x = torch.randn(6, generator=torch.Generator().manual_seed(0), requires_grad=True)
    expected = torch.tanh(x) * 2 + x.sin()
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    compiled = torch.compile(fork_join_on_the_current_stream, backend=backend)
    for _ in range(2):
        out = compiled(x)
        (grad,) = torch.autograd.grad(out.sum(), x)
        # Inductor's fused tanh and sin differ from eager's by an ulp: where the gradient
        # crosses zero (x near -1.78) torch.allclose's default atol of 1e-8 failed 4 random
        # inputs in 3,000.
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(grad, expected_grad)

    forward = capture(fork_join_on_the_current_stream, x.detach()).forward[0]
    table = torch_userstreams.explain(fork_join_on_the_current_stream, x.detach()).tables[0]
    (ambient,) = [e for e in table.entries if e.kind is EntryKind.CURRENT_STREAM]
    assert table.loads(ambient.index) and ambient.device == torch.device("cpu")
    side, ready, done = 0, 1, 2  # the function's objects, in creation order
    assert [(sync.name, sync.args) for sync in syncs(forward)][:4] == [
        ("record_event", (ready, ambient.index)),
        ("wait_event", (ready, side)),
        ("record_event", (done, side)),
        ("wait_event", (done, ambient.index)),
    ]
    assert check_stream_safety(forward).findings == []
