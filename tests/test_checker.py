"""The stream-safety checker: it fires on every hazard kind and stays quiet on safe graphs.

Negative tests start from graphs the package really executes (``capture``), delete one sync
of each kind the package's passes insert (and a user's own wait), and check that the
checker names the hazard at the right nodes and streams. Hand-built FX graphs cover each
hazard kind on its own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch._functorch._aot_autograd.streams
import torch.fx
from helpers import doubled_on_a_side_stream

from torch_userstreams.fx.meta import set_stream, stream_of
from torch_userstreams.simulator import SimStream
from torch_userstreams.testing import (
    Capture,
    HazardKind,
    SafetyResult,
    assert_stream_safe,
    capture,
    check_stream_safety,
)
from torch_userstreams.testing.checker import CURRENT_STREAMS_META, STREAM_DEVICES_META
from torch_userstreams.testing.graph_view import Sync
from torch_userstreams.testing.mutations import delete_sync, syncs
from torch_userstreams.testing.programs import leaves

aten = torch.ops.aten
streams_ops = torch.ops.streams
MAIN, SIDE = 0, 1  # table indices of the program's streams (its table lists `main` first)


def side_then_main(x: torch.Tensor, w: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    """Forward: ``a`` on the side stream, read on main after the user's record/wait.

    Backward: grad of ``a`` is made on main (``mul_4``) and read on the side stream
    (``mul_5``, ``mul_6``), so the passes add a wait for it and a ``sync_dealloc``.
    """
    main = torch.Stream(device="cpu")
    with side:
        a = x * w
    done = torch.Event(device="cpu")
    done.record(side)
    done.wait(main)
    with main:
        b = a.sin() * w
    return b


@pytest.fixture(scope="module")
def captured() -> Capture:
    torch._dynamo.reset()
    x, w = leaves()
    result = capture(side_then_main, x, w, SimStream(device="cpu"))
    torch._dynamo.reset()
    return result


def test_captured_graphs_are_safe(captured: Capture) -> None:
    assert len(captured.forward) == 1 and len(captured.backward) == 1
    for _, gm in captured.graphs:
        assert_stream_safe(gm)


def added_by(captured: Capture, pass_name: str) -> set[int]:
    """Indices of the events a pass requested (the table records who added each entry)."""
    (table,) = captured.tables
    return {e.index for e in table.entries if pass_name in e.added_by}


def pick(gm: torch.fx.GraphModule, op: object, events: set[int], stream: int) -> Sync:
    """The first sync ``op`` of ``gm`` on ``stream`` and one of ``events``."""
    return next(s for s in syncs(gm, op) if s.args[0] in events and s.args[1] == stream)


def without(gm: torch.fx.GraphModule, sync: Sync) -> SafetyResult:
    """Check a copy of ``gm`` with ``sync`` deleted (the copy is linted)."""
    mutated = copy.deepcopy(gm)
    node = next(n for n in mutated.graph.nodes if n.name == sync.node.name)
    delete_sync(mutated, node)
    mutated.graph.lint()
    return check_stream_safety(mutated)


def only(result: SafetyResult, kind: HazardKind) -> tuple[str, object, str, object]:
    """The single finding of ``result``, as (first, first stream, second, second stream)."""
    assert len(result.findings) == 1, str(result)
    (finding,) = result.findings
    assert finding.kind is kind, str(result)
    return finding.first, finding.first_stream, finding.second, finding.second_stream


def test_deleting_a_backward_wait_is_a_read_after_write(captured: Capture) -> None:
    (bw,) = captured.backward
    wait = pick(bw, streams_ops.wait_event.default, added_by(captured, "backward_syncs"), SIDE)
    result = without(bw, wait)
    assert only(result, HazardKind.RAW) == ("mul_4", MAIN, "mul_5", SIDE)
    assert "record an event on stream 0 after mul_4 and wait for it on stream 1 before mul_5" in (
        result.findings[0].fix
    )


def test_deleting_a_backward_record_leaves_the_wait_without_effect(captured: Capture) -> None:
    (bw,) = captured.backward
    record = pick(bw, streams_ops.record_event.default, added_by(captured, "backward_syncs"), MAIN)
    assert only(without(bw, record), HazardKind.RAW) == ("mul_4", MAIN, "mul_5", SIDE)


def dealloc_of(gm: torch.fx.GraphModule, tensor: str) -> Sync:
    """The ``sync_dealloc`` that holds ``tensor`` until its allocating stream waits."""
    deallocs = syncs(gm, streams_ops.sync_dealloc.default)
    return next(s for s in deallocs if getattr(s.args[2], "name", None) == tensor)


def test_deleting_a_sync_dealloc_lets_the_allocator_reuse_memory_early(captured: Capture) -> None:
    (bw,) = captured.backward
    dealloc = dealloc_of(bw, "mul_4")
    assert dealloc.args[0] in added_by(captured, "dealloc_syncs")
    result = without(bw, dealloc)
    assert only(result, HazardKind.MEMORY_REUSE) == ("mul_6", SIDE, "add", MAIN)
    assert result.findings[0].buffer == "mul_4"
    assert "sync_dealloc of mul_4" in result.findings[0].fix


def test_deleting_the_dealloc_record_is_the_same_hazard(captured: Capture) -> None:
    (bw,) = captured.backward
    dealloc = dealloc_of(bw, "mul_4")
    record = pick(bw, streams_ops.record_event.default, {dealloc.args[0]}, SIDE)
    assert only(without(bw, record), HazardKind.MEMORY_REUSE) == ("mul_6", SIDE, "add", MAIN)


def test_deleting_the_users_forward_wait_is_a_read_after_write(captured: Capture) -> None:
    (fw,) = captured.forward
    (wait,) = syncs(fw, streams_ops.wait_event.default)
    result = without(fw, wait)
    assert only(result, HazardKind.RAW) == ("mul", SIDE, "sin", MAIN)


def test_assert_stream_safe_prints_findings_and_graph(captured: Capture) -> None:
    (fw,) = captured.forward
    mutated = copy.deepcopy(fw)
    (wait,) = syncs(mutated, streams_ops.wait_event.default)
    delete_sync(mutated, wait.node)
    with pytest.raises(AssertionError) as info:
        assert_stream_safe(mutated)
    text = str(info.value)
    assert "read-after-write: sin on stream 0 reads mul" in text
    assert "graph():" in text and "%sin" in text


# -- hand-built graphs ---------------------------------------------------------------------


class Builder:
    """A small FX graph over one input ``x``; ``op(..., stream=i)`` annotates the node."""

    def __init__(self) -> None:
        self.graph = torch.fx.Graph()
        self.x = self.graph.placeholder("x")

    def op(self, target: object, *args: object, stream: int | None = None) -> torch.fx.Node:
        """A node named like AOTAutograd names it: ``mul``, ``add_``, ``sin_1``..."""
        name = target.overloadpacket.__name__  # type: ignore[attr-defined]
        node = self.graph.create_node("call_function", target, args, name=name)  # type: ignore[arg-type]
        if stream is not None:
            set_stream(node, stream)
        return node

    def sync(self, target: object, *args: object) -> torch.fx.Node:
        return self.graph.call_function(target, args)  # type: ignore[arg-type]

    def fence(self, event: int, source: int, target: int) -> None:
        """``target`` waits for everything issued on ``source`` so far."""
        self.sync(streams_ops.record_event.default, event, source)
        self.sync(streams_ops.wait_event.default, event, target)

    def check(self, *outputs: torch.fx.Node) -> SafetyResult:
        self.graph.output(tuple(outputs))
        self.graph.lint()
        return check_stream_safety(torch.fx.GraphModule(torch.nn.Module(), self.graph))


def raw(fenced: bool) -> SafetyResult:
    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)
    if fenced:
        g.fence(0, source=1, target=2)
    b = g.op(aten.sin.default, a, stream=2)
    return g.check(a, b)


def war(fenced: bool) -> SafetyResult:
    """``b`` reads ``a`` on stream 2, then stream 1 updates ``a`` in place."""
    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)
    g.fence(0, source=1, target=2)
    b = g.op(aten.sin.default, a, stream=2)
    if fenced:
        g.fence(1, source=2, target=1)
    g.op(aten.add_.Tensor, a, 1, stream=1)
    return g.check(a, b)


def waw_on_input(fenced: bool) -> SafetyResult:
    """Two streams mutate the graph's input: in-place ops are writes through their schema."""
    g = Builder()
    g.op(aten.add_.Tensor, g.x, 1, stream=1)
    if fenced:
        g.sync(streams_ops.wait_stream.default, 2, 1)
    g.op(aten.mul_.Tensor, g.x, 2, stream=2)
    return g.check(g.x)


def war_on_input(fenced: bool) -> SafetyResult:
    """Reading an input is safe, until another stream overwrites it (``copy_``)."""
    g = Builder()
    y = g.op(aten.sin.default, g.x, stream=1)
    z = g.op(aten.cos.default, g.x, stream=2)
    if fenced:
        g.sync(streams_ops.wait_stream.default, 2, 1)
    g.op(aten.copy_.default, g.x, z, stream=2)
    return g.check(y)


def write_through_view(fenced: bool) -> SafetyResult:
    """A write to a view is a write to its base."""
    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)
    g.fence(0, source=1, target=2)
    b = g.op(aten.sin.default, a, stream=2)
    view = g.op(aten.view.default, a, [-1], stream=1)
    if fenced:
        g.fence(1, source=2, target=1)
    g.op(aten.mul_.Tensor, view, 2, stream=1)
    return g.check(a, b)


def collective_read_elsewhere(fenced: bool) -> SafetyResult:
    """An all_reduce on a comm stream (1), its result read on stream 2: only after a wait."""
    import torch.distributed._functional_collectives

    functional = torch.ops._c10d_functional
    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)
    reduced = g.op(functional.all_reduce.default, a, "sum", "group", stream=1)
    done = g.op(functional.wait_tensor.default, reduced, stream=1)
    if fenced:
        g.fence(0, source=1, target=2)
    b = g.op(aten.sin.default, done, stream=2)
    return g.check(done, b)


def reuse(fix: str) -> SafetyResult:
    """``a`` is allocated on stream 1, last used on stream 2; then stream 1 allocates ``c``."""
    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)
    g.fence(0, source=1, target=2)
    b = g.op(aten.sin.default, a, stream=2)
    if fix == "sync_dealloc":
        g.sync(streams_ops.record_event.default, 1, 2)
        g.sync(streams_ops.sync_dealloc.default, 1, 1, a)
    elif fix == "record_stream":
        g.sync(streams_ops.record_stream.default, a, 2)
    c = g.op(aten.cos.default, g.x, stream=1)
    return g.check(b, c)


Case = Callable[[bool], SafetyResult]


@pytest.mark.parametrize(
    ("case", "kind", "expected"),
    [
        (raw, HazardKind.RAW, ("mul", 1, "sin", 2)),
        (war, HazardKind.WAR, ("sin", 2, "add_", 1)),
        (waw_on_input, HazardKind.WAW, ("add_", 1, "mul_", 2)),
        (war_on_input, HazardKind.WAR, ("sin", 1, "copy_", 2)),
        (write_through_view, HazardKind.WAR, ("sin", 2, "mul_", 1)),
    ],
    ids=["raw", "war", "waw-input-mutation", "war-input-mutation", "write-through-view"],
)
def test_hand_built_hazard(case: Case, kind: HazardKind, expected: tuple) -> None:
    assert only(case(False), kind) == expected
    fixed = case(True)
    assert fixed, str(fixed)


def test_a_collective_read_on_another_stream_without_a_wait_is_reported() -> None:
    result = collective_read_elsewhere(False)
    found = {(f.kind, f.first, f.first_stream, f.second, f.second_stream) for f in result.findings}
    raw = HazardKind.RAW
    assert found == {(raw, "all_reduce", 1, "sin", 2), (raw, "wait_tensor", 1, "sin", 2)}
    fixed = collective_read_elsewhere(True)
    assert fixed, str(fixed)


def test_memory_reuse_and_its_two_fixes() -> None:
    result = reuse("none")
    assert only(result, HazardKind.MEMORY_REUSE) == ("sin", 2, "cos", 1)
    assert result.findings[0].buffer == "mul"
    assert reuse("sync_dealloc"), str(reuse("sync_dealloc"))
    assert reuse("record_stream"), str(reuse("record_stream"))


def test_memory_reuse_after_the_graph_returns() -> None:
    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)
    g.fence(0, source=1, target=2)
    b = g.op(aten.sin.default, a, stream=2)
    result = g.check(b)
    assert only(result, HazardKind.MEMORY_REUSE) == ("sin", 2, "<end of graph>", 1)


def test_reading_inputs_on_many_streams_is_safe() -> None:
    g = Builder()
    outs = [g.op(aten.sin.default, g.x, stream=s) for s in (1, 2, 3)]
    assert g.check(*outs)


HOST_BARRIERS = {
    "synchronize_device": ("cpu", 0),
    "synchronize_stream": (1,),
    "synchronize_event": (0,),
}


@pytest.mark.parametrize("barrier", sorted(HOST_BARRIERS))
def test_host_synchronization_orders_later_work_on_every_stream(barrier: str) -> None:
    if not hasattr(streams_ops, barrier):
        pytest.skip(f"this torch has no streams::{barrier}")
    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)
    g.sync(streams_ops.record_event.default, 0, 1)
    g.sync(getattr(streams_ops, barrier).default, *HOST_BARRIERS[barrier])
    b = g.op(aten.sin.default, a, stream=2)
    c = g.op(aten.cos.default, a, stream=3)
    assert g.check(a, b, c)


def test_waiting_on_an_event_recorded_before_the_producer_orders_nothing() -> None:
    g = Builder()
    g.sync(streams_ops.record_event.default, 0, 1)
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)
    g.sync(streams_ops.wait_event.default, 0, 2)
    b = g.op(aten.sin.default, a, stream=2)
    assert only(g.check(a, b), HazardKind.RAW) == ("mul", 1, "sin", 2)


@pytest.mark.parametrize("spelling", ["positional", "keywords", "mixed"])
def test_syncs_written_with_keyword_arguments_order_the_same(spelling: str) -> None:
    """A backend may spell a sync with keywords; the checker read only positional ones
    (IndexError) and the prologue missed the indices they name."""
    from torch_userstreams.compile.prologue import referenced_indices

    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)
    for op, stream in ((streams_ops.record_event.default, 1), (streams_ops.wait_event.default, 2)):
        if spelling == "positional":
            g.sync(op, 0, stream)
        elif spelling == "keywords":
            g.graph.call_function(op, (), {"stream_index": stream, "event_index": 0})
        else:
            g.graph.call_function(op, (0,), {"stream_index": stream})
    b = g.op(aten.sin.default, a, stream=2)
    result = g.check(a, b)
    assert result and result.syncs == [
        "record_event_default: record_event(0, 1)",
        "wait_event_default: wait_event(0, 2)",
    ]
    assert referenced_indices(g.graph) == {0, 1, 2}


def test_a_device_sync_names_a_device_not_a_table_entry() -> None:
    """``synchronize_device('cuda', 0)``'s 0 was read as table index 0: the graph's
    compile was refused, and a current-stream entry 0 was loaded for nothing."""
    from torch_userstreams.compile.prologue import referenced_indices

    if not hasattr(streams_ops, "synchronize_device"):
        pytest.skip("this torch has no streams::synchronize_device op")
    g = Builder()
    g.sync(streams_ops.synchronize_device.default, "cuda", 3)
    g.graph.call_function(
        streams_ops.synchronize_device.default, (), {"device_type": "cuda", "device_index": 1}
    )
    g.sync(streams_ops.wait_stream.default, 4, 5)
    assert referenced_indices(g.graph) == {4, 5}


@pytest.mark.usefixtures("installed")
def test_the_executor_runs_syncs_written_with_keywords() -> None:
    """The executors read only a sync's positional arguments: TypeError, missing 3."""
    from torch_userstreams.backends import aot_with_executor
    from torch_userstreams.backends.executor import compile_with_streams
    from torch_userstreams.fx.ops import is_sync_op

    rewritten = []

    def keywords_forward(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        for node in gm.graph.nodes:
            if node.op == "call_function" and is_sync_op(node.target) and node.args:
                names = [argument.name for argument in node.target._schema.arguments]
                node.kwargs = dict(zip(names, node.args, strict=False))
                node.args = ()
                rewritten.append(node.name)
        gm.recompile()
        return compile_with_streams(gm, example_inputs)

    backend = aot_with_executor(keywords_forward, compile_with_streams)
    out = torch.compile(doubled_on_a_side_stream, backend=backend)(
        torch.ones(2), SimStream(device="cpu")
    )
    torch.testing.assert_close(out, torch.full((2,), 2.0).sin())
    assert any(name.startswith("sync_dealloc") for name in rewritten), rewritten


def test_unannotated_nodes_run_on_the_named_current_stream() -> None:
    """``None`` and the current stream's index are one stream when the index is known."""
    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x)  # current stream
    g.sync(streams_ops.record_event.default, 0, 5)  # 5: the current stream's index
    g.sync(streams_ops.wait_event.default, 0, 1)
    b = g.op(aten.sin.default, a, stream=1)
    g.graph.output((a, b))
    gm = torch.fx.GraphModule(torch.nn.Module(), g.graph)
    assert check_stream_safety(gm, current_streams={"cpu": 5})
    assert check_stream_safety(gm, current_streams={torch.device("cpu"): 5})
    assert only(check_stream_safety(gm), HazardKind.RAW) == ("mul", None, "sin", 1)
    with pytest.raises(TypeError, match="5 is not a device"):
        check_stream_safety(gm, current_streams={5: 5})  # type: ignore[dict-item]


@pytest.mark.parametrize("key", ["cuda:0", torch.device("cuda:0"), "cuda", torch.device("cuda")])
def test_a_current_stream_keyed_with_or_without_a_device_index_is_found(key: object) -> None:
    """A key without an index ('cuda') named no device: its nodes became their own stream."""
    from torch._subclasses import FakeTensorMode

    with FakeTensorMode():
        value = torch.empty(3, device="cuda")
    g = Builder()
    g.x.meta["val"] = value
    a = g.op(aten.mul.Tensor, g.x, g.x)
    a.meta["val"] = value
    b = g.op(aten.sin.default, a, stream=1)
    b.meta["val"] = value
    g.graph.output((a, b))
    gm = torch.fx.GraphModule(torch.nn.Module(), g.graph)
    assert check_stream_safety(gm, current_streams={key: 1})  # type: ignore[dict-item]
    assert only(check_stream_safety(gm), HazardKind.RAW) == ("mul", None, "sin", 1)


def test_cpu_tensor_work_under_an_accelerator_stream_runs_in_host_order() -> None:
    """As the passes read it (no sync between them): CPU-tensor work under a ``cuda``
    stream runs on the host, in program order with the CPU's current stream. The checker
    took the two for streams of their own and reported hazards the passes rightly left."""
    g = Builder()
    a = g.op(aten.mul.Tensor, g.x, g.x, stream=1)  # CPU tensors (no device in meta)
    b = g.op(aten.sin.default, a)  # the CPU's current stream, index 5
    g.graph.output((a, b))
    gm = torch.fx.GraphModule(torch.nn.Module(), g.graph)
    gm.meta[CURRENT_STREAMS_META] = {"cpu": 5}
    gm.meta[STREAM_DEVICES_META] = {1: "cuda:0", 5: "cpu"}
    assert check_stream_safety(gm)
    gm.meta[STREAM_DEVICES_META] = {1: "cpu", 5: "cpu"}  # a CPU stream stands in for one
    assert only(check_stream_safety(gm), HazardKind.RAW) == ("mul", 1, "sin", 5)


def read_on_another_stream(x: torch.Tensor, s: torch.Stream, m: torch.Stream) -> torch.Tensor:
    s.wait_stream(m)
    with s:
        a = x * 2  # allocated on s
    m.wait_stream(s)
    with m:
        return (a + 1) * x  # a's last use, on m: it dies inside the graph


def update_then_read_elsewhere(
    buf: torch.Tensor, x: torch.Tensor, s: torch.Stream, m: torch.Stream
) -> torch.Tensor:
    with s:
        buf.add_(x)  # functionalized: a new tensor on s, copied back into buf at the end
    m.wait_stream(s)
    with m:
        return buf.sin()


MUTATES_UNDER_STREAMS = not torch.__version__.startswith(("2.11.", "2.12."))


@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
@pytest.mark.parametrize("grad", [True, False], ids=["training", "inference"])
def test_a_value_last_read_on_another_stream_is_freed_safely(backend: str, grad: bool) -> None:
    """An inference graph gets the deallocation syncs of a training graph's forward: from
    AOTAutograd's one stream hook on 2.12+, from the package's backends on 2.11."""
    x = torch.rand(4, requires_grad=grad)
    streams = SimStream(device="cpu"), SimStream(device="cpu")
    result = capture(read_on_another_stream, x, *streams, backend=backend)
    (forward,) = result.forward
    assert_stream_safe(forward)
    assert syncs(forward, streams_ops.sync_dealloc.default)


@pytest.mark.skipif(not MUTATES_UNDER_STREAMS, reason="this torch refuses input mutations there")
@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_an_inference_graphs_input_update_read_elsewhere_is_freed_safely(backend: str) -> None:
    """The copy back into the input is tagged for the backward even in an inference graph:
    the update's reads were taken for backward ones, and no sync freed it."""
    streams = SimStream(device="cpu"), SimStream(device="cpu")
    args = torch.zeros(4), torch.rand(4), *streams
    result = capture(update_then_read_elsewhere, *args, backend=backend)
    (forward,) = result.forward
    assert_stream_safe(forward)


def average_on_side(ema: list[torch.Tensor], params: list[torch.Tensor], s: torch.Stream) -> None:
    with s:
        torch._foreach_lerp_(ema, params, 0.25)


@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_an_input_update_is_written_back_on_the_stream_that_made_it(backend: str) -> None:
    """``userstreams_aot_eager`` left the update of an input that needs no gradient (an
    EMA, a norm's running statistics) to AOTAutograd's epilogue, which copies it back after
    the graph, on the current stream, with no wait for the side stream that computed it."""
    ema, params = [torch.zeros(4)], [torch.ones(4)]
    result = capture(average_on_side, ema, params, SimStream(device="cpu"), backend=backend)
    (forward,) = result.forward
    (copy,) = [n for n in forward.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert copy.args[0].op == "placeholder"
    assert stream_of(copy) == stream_of(copy.args[1]) is not None
    assert_stream_safe(forward)
    torch.testing.assert_close(ema[0], torch.full((4,), 0.25))


def loss_on_side(x: torch.Tensor, w: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    with side:
        return (x * w).sin().sum()


@pytest.fixture(scope="module")
def side_backward() -> tuple[torch.fx.GraphModule, set[int]]:
    torch._dynamo.reset()
    x, w = leaves()
    result = capture(loss_on_side, x, w, SimStream(device="cpu"))
    torch._dynamo.reset()
    (bw,) = result.backward
    return bw, added_by(result, "backward_syncs")


def test_the_backward_edges_are_synced(side_backward: tuple) -> None:  # type: ignore[type-arg]
    bw, _ = side_backward
    assert_stream_safe(bw)


ONLY_SIDE, CURRENT = 0, 1  # loss_on_side's table: its side stream, then the current stream


def test_deleting_the_backwards_entry_wait_is_a_read_of_the_incoming_gradient(
    side_backward: tuple,  # type: ignore[type-arg]
) -> None:
    """The engine writes the incoming gradient on the current stream."""
    bw, events = side_backward
    entry = pick(bw, streams_ops.wait_event.default, events, ONLY_SIDE)
    first, first_stream, _reader, second_stream = only(without(bw, entry), HazardKind.RAW)
    assert (first, first_stream, second_stream) == ("tangents_1", CURRENT, ONLY_SIDE)


def test_deleting_the_backwards_exit_wait_is_a_read_of_a_returned_gradient(
    side_backward: tuple,  # type: ignore[type-arg]
) -> None:
    """The engine reads the returned gradients on the current stream after the graph."""
    bw, events = side_backward
    exit_wait = pick(bw, streams_ops.wait_event.default, events, CURRENT)
    _maker, first_stream, second, second_stream = only(without(bw, exit_wait), HazardKind.RAW)
    assert (first_stream, second, second_stream) == (ONLY_SIDE, "output", CURRENT)


def normed_on_side(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    side = torch.Stream(device="cpu")
    with side:
        return torch.nn.functional.layer_norm(x, (4,), w)


@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_no_read_of_the_incoming_gradient_moves_above_the_entry_wait(backend: str) -> None:
    """layer_norm's backward reads the incoming gradient several times on the side stream;
    the min-cut partitioner's reordering moved the first reads above the wait that orders
    them after the current stream (the wait now passes the gradient through)."""
    x, w = torch.rand(3, 4, requires_grad=True), torch.rand(4, requires_grad=True)
    result = capture(normed_on_side, x, w, backend=backend)
    for _, gm in result.graphs:
        assert_stream_safe(gm)


@pytest.mark.parametrize("not_a_graph", [lambda x: x, torch.fx.Graph(), None])
def test_something_other_than_a_graph_module_is_a_type_error_naming_it(not_a_graph: object) -> None:
    with pytest.raises(TypeError, match=r"checks a torch\.fx\.GraphModule, not ") as exc:
        check_stream_safety(not_a_graph)  # type: ignore[arg-type]
    assert f"not {type(not_a_graph).__name__}: pass a graph" in str(exc.value)
    assert "an item of torch_userstreams.testing.capture(fn, *args).forward" in str(exc.value)


def _race_in(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    with side:
        y = x * 2  # made on the side stream
    return y.clone()  # read on the current stream with no wait


def _all_on(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    with side:
        return (x * 2).clone()


@pytest.mark.parametrize(("branch", "hazards"), [(_race_in, 2), (_all_on, 0)])
def test_a_cond_branch_is_checked_like_the_graph_around_it(
    branch: Callable[[torch.Tensor, torch.Stream], torch.Tensor], hazards: int
) -> None:
    """The cond node was read as one kernel: a race inside a branch went unreported."""
    side = torch.Stream(device="cpu")

    def program(x: torch.Tensor) -> torch.Tensor:
        taken = torch.cond(x.sum() > 0, lambda x: branch(x, side), lambda x: x * 3, (x,))
        return taken + 1

    result = check_stream_safety(capture(program, torch.ones(3)).forward[0])
    assert len(result.findings) == hazards, result
    details = [finding.detail for finding in result.findings]
    if hazards:
        assert details[0].startswith("subgraph true_graph_0: clone on the current stream reads mul")
        assert details[1].startswith("subgraph true_graph_0: mul was allocated on stream 0")
        assert [f.kind.value for f in result.findings] == ["read-after-write", "memory-reuse"]


def _cond_of_pair(
    pred: torch.Tensor,
    branches: tuple[torch.fx.GraphModule, torch.fx.GraphModule],
    operands: tuple[torch.Tensor, ...],
) -> torch.Tensor:
    return torch.cond(pred, branches[0], branches[1], operands)


def test_a_subgraph_inside_a_tuple_argument_is_checked() -> None:
    """flex_attention passes its mask_mod inside the block-mask tuple: a subgraph named only
    inside a tuple went unchecked. Here cond's branches are moved into one tuple argument."""
    side = torch.Stream(device="cpu")

    def program(x: torch.Tensor) -> torch.Tensor:
        taken = torch.cond(x.sum() > 0, lambda x: _race_in(x, side), lambda x: x * 3, (x,))
        return taken + 1

    gm = capture(program, torch.ones(3)).forward[0]
    (cond,) = [n for n in gm.graph.nodes if n.target is torch.ops.higher_order.cond]
    pred, on_true, on_false, operands = cond.args
    cond.target, cond.args = _cond_of_pair, (pred, (on_true, on_false), operands)
    gm.recompile()
    details = [finding.detail for finding in check_stream_safety(gm).findings]
    assert len(details) == 2, details
    assert details[0].startswith("subgraph true_graph_0: clone on the current stream reads mul")
