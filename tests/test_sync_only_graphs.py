"""Graphs whose only stream work is a sync, with no ``with stream:`` block.

Dynamo writes a sync as the op packet (``torch.ops.streams.record_event``), AOTAutograd as
its overload (``.default``); ``fx.ops.is_sync_op`` knew only overloads. So ``userstreams``
took such a Dynamo graph for a stream-free one and handed it to plain Inductor, which freed
the inputs before the sync and crashed reading them (``UnboundLocalError``) whenever the
sync followed compute; after ``uninstall()`` such a graph was not refused, and its event
was recorded on a stream of native's table instead of the one passed in. Found by a
hostile test pass.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torch_userstreams
from torch_userstreams.fx.ops import is_sync_op
from torch_userstreams.inductor.regions import has_stream_work
from torch_userstreams.simulator import SimEvent, SimStream
from torch_userstreams.testing.fake_accelerator import (
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)

BACKENDS = ["userstreams", "userstreams_aot_eager"]


def sync_between_compute(
    x: torch.Tensor, event: torch.Event, side: torch.Stream, main: torch.Stream
) -> torch.Tensor:
    y = x * 3
    event.record(side)
    event.wait(main)
    return y.cos()


def test_a_sync_op_is_recognised_as_dynamo_and_aotautograd_write_it() -> None:
    import torch._dynamo.variables.streams  # defines torch.ops.streams

    packet = torch.ops.streams.record_event
    assert is_sync_op(packet) and is_sync_op(packet.default)
    assert not is_sync_op(torch.ops.aten.cos) and not is_sync_op(torch.ops.aten.cos.default)


@pytest.mark.usefixtures("installed")
def test_dynamo_graph_with_only_a_sync_has_stream_work() -> None:
    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return gm.forward

    x, event, stream = torch.ones(2), SimEvent(device="cpu"), SimStream(device="cpu")
    torch.compile(sync_between_compute, backend=keep)(x, event, stream, stream)
    [gm] = graphs
    assert has_stream_work(gm)


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sync_between_compute_runs_on_an_accelerator(backend: str) -> None:
    with fake_accelerator() as main:
        compiled = torch.compile(sync_between_compute, backend=backend)
        for _ in range(2):
            x, event = torch.randn(5), FakeAcceleratorEvent()
            side = FakeAcceleratorStream()
            torch.testing.assert_close(compiled(x, event, side, main), (x * 3).cos())
            assert [name for name, _ in event.log] in (
                ["record", "wait"],
                ["record", "waited_by"],  # torch 2.11 issues it as stream.wait_event
            )


def record_only(x: torch.Tensor, event: torch.Event, stream: torch.Stream) -> torch.Tensor:
    event.record(stream)
    return x + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_recompile_after_uninstall_of_a_sync_only_graph_is_refused(backend: str) -> None:
    with torch_userstreams.installed():
        compiled = torch.compile(record_only, backend=backend)
        compiled(torch.ones(2), SimEvent(device="cpu"), SimStream(device="cpu"))
    event = SimEvent(device="cpu")
    with pytest.raises(Exception, match=r"(?s)uses streams or events.*not installed"):
        compiled(torch.ones(3), event, SimStream(device="cpu"))
    assert event.log == []


def sync_then_mutate_input(x: torch.Tensor, event: torch.Event, side: torch.Stream) -> torch.Tensor:
    y = x * 2
    event.record(side)
    event.wait()
    x.add_(1)
    return y * x


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_inference_graph_that_syncs_and_mutates_an_input_compiles(backend: str) -> None:
    """The epilogue copy into ``x`` carries the backward's tag in an inference graph; the
    sync-ordering pass took the graph for a joint one and stopped (``PassContractError``)."""
    with fake_accelerator():
        x = torch.randn(4)
        expected_x, event = x.clone(), FakeAcceleratorEvent()
        expected = sync_then_mutate_input(expected_x, event, FakeAcceleratorStream())
        event = FakeAcceleratorEvent()
        out = torch.compile(sync_then_mutate_input, backend=backend)(
            x, event, FakeAcceleratorStream()
        )
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x, expected_x)
    assert [name for name, _ in event.log] in (["record", "wait"], ["record", "waited_by"])


def checkpointed_body(y: torch.Tensor, event: torch.Event, side: torch.Stream) -> torch.Tensor:
    event.record(side)
    event.wait()  # on the current stream: read only inside the checkpoint
    return y.sin() * y


def checkpointed_sync_on_current_stream(
    x: torch.Tensor, event: torch.Event, side: torch.Stream
) -> torch.Tensor:
    body = torch.utils.checkpoint.checkpoint(
        checkpointed_body, x * 2, event, side, use_reentrant=False
    )
    return body.cos()  # type: ignore[no-any-return]


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_current_stream_read_only_inside_a_checkpoint_is_loaded(backend: str) -> None:
    """The prologue loads the ambient current stream only where a graph reads it; it looked
    at the frame's graph and not at the checkpointed body (``UserObjectError``: not
    loaded by the prologue)."""
    with fake_accelerator() as main:
        x, event, side = torch.randn(4), FakeAcceleratorEvent(), FakeAcceleratorStream()
        compiled = torch.compile(checkpointed_sync_on_current_stream, backend=backend)
        out = compiled(x, event, side)
    torch.testing.assert_close(out, checkpointed_sync_on_current_stream(x, event, side))
    assert event.log[:2] in (
        [("record", side), ("wait", main)],
        [("record", side), ("waited_by", main)],
    )


def checkpointed_wait_stream(x: torch.Tensor, side: torch.Stream, other: torch.Stream) -> Any:
    def body(t: torch.Tensor) -> torch.Tensor:
        u = t.exp()
        side.wait_stream(other)
        return u * t

    return torch.utils.checkpoint.checkpoint(body, x, use_reentrant=False) + 1


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_method_sync_inside_a_checkpoint_runs_on_every_call(backend: str) -> None:
    """torch 2.11 records ``wait_stream`` as a method call; the package turns those into
    sync ops, but only in the frame's graph: in a checkpointed body AOTAutograd ran it once
    while tracing and every later call skipped it."""
    with fake_accelerator():
        compiled = torch.compile(checkpointed_wait_stream, backend=backend)
        for _ in range(2):
            x, side, other = torch.randn(4), FakeAcceleratorStream(), FakeAcceleratorStream()
            torch.testing.assert_close(compiled(x, side, other), x.exp() * x + 1)
            assert side.log == [("wait_stream", other)]


def read_after_a_wait_then_updated(
    x: torch.Tensor, buf: torch.Tensor, s: torch.Stream, e: torch.Event, main: torch.Stream
) -> torch.Tensor:
    e.record(main)
    with s:
        s.wait_event(e)
        z = x * buf
    e.record(s)
    e.wait(main)
    buf.add_(1)  # like a norm's running statistics, read on the side stream first
    return z


@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_an_input_read_after_a_wait_and_then_updated_compiles(backend: str) -> None:
    """A wait passes through the values its stream reads next; an input passed through
    made the copy back into it name the passthrough, which Inductor refused."""
    torch_userstreams.install()
    x, buf = torch.ones(3), torch.zeros(3)
    compiled = torch.compile(read_after_a_wait_then_updated, backend=backend)
    streams = SimStream(device="cpu"), SimEvent(device="cpu"), SimStream(device="cpu")
    out = compiled(x, buf, *streams)
    torch.testing.assert_close(out, torch.zeros(3))
    torch.testing.assert_close(buf, torch.ones(3))
