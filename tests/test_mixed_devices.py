"""Tensors on one device, streams on another: events the passes make are the streams'.

On a GPU machine ``torch.Stream()`` is a CUDA stream, and eager lets CPU tensors be computed
inside it. Here the fake accelerator stands in for CUDA (``testing.fake_accelerator``):
its streams say ``cuda:0`` while the tensors stay on the CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_userstreams.compile.graph_compile import GraphCompile
from torch_userstreams.compile.table import EntryKind, Phase
from torch_userstreams.errors import UnsupportedPathError
from torch_userstreams.fx.meta import set_stream
from torch_userstreams.fx.ops import is_sync_op
from torch_userstreams.passes import backward_syncs, dealloc_syncs
from torch_userstreams.patch.install import installed
from torch_userstreams.simulator import SimStream
from torch_userstreams.testing import capture
from torch_userstreams.testing.fake_accelerator import (
    DEVICE,
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)

ops = torch.ops


def two_branches(x: torch.Tensor, y: torch.Tensor, s0: torch.Stream, s2: torch.Stream):  # type: ignore[no-untyped-def]
    with s0:
        y0 = 2 * x + y
    with s2:
        z = 2 * x + y
    return (y0 * z).sum()


def test_cpu_tensors_in_accelerator_streams_train_like_eager() -> None:
    x, y = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    with fake_accelerator():
        s0, s2 = FakeAcceleratorStream(), FakeAcceleratorStream()
        run = capture(two_branches, x, y, s0, s2)
        ex, ey = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
        two_branches(ex, ey, s0, s2).backward()
    torch.testing.assert_close((x.grad, y.grad), (ex.grad, ey.grad))
    (table,) = run.tables
    made_by_passes = [e for e in table.entries if e.phase is Phase.BACKWARD]
    assert made_by_passes, table.describe()
    assert {e.device for e in made_by_passes} == {DEVICE}, table.describe()


def cpu_and_accelerator_streams(
    x: torch.Tensor, accelerator: torch.Stream, cpu: torch.Stream, done: torch.Event
) -> torch.Tensor:
    with cpu:
        y = x.sin()
    with accelerator:
        z = y * x  # y crosses from a CPU stream to an accelerator stream: host-ordered
    done.record(accelerator)
    done.wait()
    return z + y


@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_cpu_tensors_across_a_cpu_and_an_accelerator_stream_train_like_eager(
    backend: str,
) -> None:
    """No event orders a CPU stream and an accelerator stream, and none is needed for CPU
    tensors: the host ran both blocks in program order. Inductor's backend refused this
    (helper-51): its check that every cross-stream buffer's reuse is synced wanted the
    event the dealloc pass rightly did not make."""
    x = torch.tensor([0.1, 0.5, -0.3], requires_grad=True)
    with fake_accelerator():
        args = (FakeAcceleratorStream(), SimStream(device="cpu"), FakeAcceleratorEvent())
        run = capture(cpu_and_accelerator_streams, x, *args, backend=backend)
        ex = x.detach().clone().requires_grad_()
        expected = cpu_and_accelerator_streams(ex, *args)
        expected.sum().backward()
        with torch.no_grad(), installed():  # an inference graph: compiled afresh
            inferred = run.compiled(x, *args)
    torch.testing.assert_close(run.result, expected)
    torch.testing.assert_close(x.grad, ex.grad)
    torch.testing.assert_close(inferred, expected.detach())


# -- the rule, on hand-built backward graphs ------------------------------------------------

CPU_STREAM, ACCELERATOR_STREAM = 0, 1


@pytest.fixture
def compile_() -> GraphCompile:
    """A graph's compile whose table has a CPU stream (0) and an accelerator stream (1)."""
    compile_ = GraphCompile()
    for origin, stream in (
        ("cpu_stream", SimStream(device="cpu")),
        ("side", FakeAcceleratorStream()),
    ):
        compile_.table.add(EntryKind.INPUT, origin, lambda cg: None, stream, added_by="test")
    return compile_


def _backward_graph(value: torch.Tensor, producer_stream: int | None, consumer_stream: int | None):  # type: ignore[no-untyped-def]
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    nodes = []
    for target, stream in (
        (ops.aten.sin.default, producer_stream),
        (ops.aten.cos.default, consumer_stream),
    ):
        node = graph.call_function(target, (nodes[-1] if nodes else x,))
        node.meta.update(val=value, partitioner_tag="is_backward")
        if stream is not None:
            set_stream(node, stream)
        nodes.append(node)
    graph.output(nodes[-1])
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def _syncs(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if is_sync_op(n.target)]


def test_host_ordered_work_needs_no_sync_between_cpu_and_accelerator_streams(
    compile_: GraphCompile,
) -> None:
    """A CPU tensor made inside an accelerator stream, read by CPU code: the host ran both
    in program order, so no event is made (none could be recorded on the one and waited
    on by the other)."""
    gm = _backward_graph(torch.ones(2), ACCELERATOR_STREAM, None)
    assert not backward_syncs.PASS.run(gm, compile_)
    assert not dealloc_syncs.PASS.run(gm, compile_)
    assert _syncs(gm) == []


def test_accelerator_streams_sync_with_events_of_their_device(compile_: GraphCompile) -> None:
    gm = _backward_graph(torch.ones(2), ACCELERATOR_STREAM, None)
    table = compile_.table
    side_2 = table.add(
        EntryKind.INPUT, "side_2", lambda cg: None, FakeAcceleratorStream(), added_by="test"
    )
    for node in gm.graph.nodes:
        if node.target is ops.aten.cos.default:
            set_stream(node, side_2)
    with fake_accelerator():
        assert backward_syncs.PASS.run(gm, compile_)
    events = [e for e in table.entries if e.kind is EntryKind.REQUESTED]
    assert [e.device for e in events] == [DEVICE]


def test_accelerator_tensor_across_a_cpu_stream_is_rejected_naming_both_devices(
    compile_: GraphCompile,
) -> None:
    with FakeTensorMode():
        on_accelerator = torch.empty(2, device=DEVICE)
    gm = _backward_graph(on_accelerator, CPU_STREAM, ACCELERATOR_STREAM)
    with pytest.raises(UnsupportedPathError) as info:
        backward_syncs.PASS.run(gm, compile_)
    message = str(info.value)
    assert "cuda:0" in message and "cpu" in message and "torch.Stream(device='cuda:0')" in message
