"""Each backward pass on its own, on hand-built joint graphs; ``graph.lint()`` after each."""

from __future__ import annotations

import operator

import pytest
import torch
import torch._functorch._aot_autograd.streams
import torch.fx

from torch_userstreams.compile.contract import (
    FACTS,
    Fact,
    GraphPass,
    PassContractError,
    run_passes,
)
from torch_userstreams.compile.graph_compile import GraphCompile
from torch_userstreams.compile.table import EntryKind, Phase, Reader
from torch_userstreams.fx.meta import record, records, set_stream, stream_of
from torch_userstreams.passes import (
    backward_phase,
    backward_syncs,
    dealloc_syncs,
    grad_accumulation,
    inherit_streams,
    sync_ordering,
)
from torch_userstreams.simulator import SimStream

ops = torch.ops
VAL = torch.ones(2)


STREAMS = 3  # the graphs below use streams 0, 1 and 2


@pytest.fixture
def compile_() -> GraphCompile:
    """A graph's compile whose table starts with three CPU streams (indices 0-2): the passes'
    requests land there."""
    compile_ = GraphCompile()
    for i in range(STREAMS):
        compile_.table.add(
            EntryKind.INPUT, f"s{i}", lambda cg: None, SimStream(device="cpu"), added_by="test"
        )
    return compile_


def run(graph_pass: GraphPass, gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    """One pass on its own: its notes (empty when it changed nothing)."""
    return graph_pass.run(gm, compile_)


def node(
    graph: torch.fx.Graph,
    target: object,
    args: tuple,  # type: ignore[type-arg]
    *,
    stream: int | None = None,
    backward: bool = True,
    **meta: object,
) -> torch.fx.Node:
    n = graph.call_function(target, args)  # type: ignore[arg-type]
    n.meta["val"] = VAL
    n.meta["partitioner_tag"] = "is_backward" if backward else "is_forward"
    n.meta.update(meta)
    if stream is not None:
        set_stream(n, stream)
    return n


def module(graph: torch.fx.Graph) -> torch.fx.GraphModule:
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def syncs(gm: torch.fx.GraphModule, target: object) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is target]


def test_backward_phase_tags_untagged_nodes_after_the_first_backward_node() -> None:
    """What a custom Function's backward traces has no tag; before the backward starts,
    an untagged node (if torch left one) stays as it is."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    early = node(graph, ops.aten.sin.default, (x,), backward=False)
    early.meta.pop("partitioner_tag")
    fwd = node(graph, ops.aten.cos.default, (early,), backward=False)
    first = node(graph, ops.aten.neg.default, (fwd,))
    custom = node(graph, ops.aten.mul.Tensor, (first, fwd))
    custom.meta.pop("partitioner_tag")
    graph.output(custom)
    gm = module(graph)
    notes = run(backward_phase.PASS, gm, GraphCompile())
    assert notes == ["traced in a custom backward [mul_tensor]"]
    tags = [n.meta.get("partitioner_tag") for n in (early, fwd, first, custom)]
    assert tags == [None, "is_forward", "is_backward", "is_backward"]
    assert not run(backward_phase.PASS, gm, GraphCompile()), "idempotent"


def test_backward_phase_tags_a_custom_backward_that_opens_the_backward() -> None:
    """The compiled function returns the Function's output: its backward's sync and work
    come first, before any tagged backward node. Only the tangent says a backward exists."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    tangent = graph.placeholder("tangents_1")
    tangent.meta["partitioner_tag"] = "is_backward"
    fwd = node(graph, ops.aten.sin.default, (x,), backward=False)
    record = graph.call_function(ops.streams.record_event.default, (0, 1))
    custom = node(graph, ops.aten.mul.Tensor, (tangent, 2))
    custom.meta.pop("partitioner_tag")
    graph.output((fwd, custom))
    notes = run(backward_phase.PASS, module(graph), GraphCompile())
    assert notes == [
        "traced in a custom backward [record_event_default]",
        "traced in a custom backward [mul_tensor]",
    ]
    assert [n.meta.get("partitioner_tag") for n in (fwd, record, custom)] == [
        "is_forward",
        "is_backward",
        "is_backward",
    ]


def test_backward_phase_leaves_a_graph_without_a_backward_alone() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    fwd = node(graph, ops.aten.sin.default, (x,), backward=False)
    graph.call_function(ops.streams.record_event.default, (0, 1))
    graph.output(fwd)
    assert not run(backward_phase.PASS, module(graph), GraphCompile())


def test_inherit_streams_copies_the_forward_stream_by_seq_nr() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    fwd = node(graph, ops.aten.sin.default, (x,), stream=2, backward=False, seq_nr=7)
    bwd = node(graph, ops.aten.cos.default, (fwd,), seq_nr=7)
    other = node(graph, ops.aten.neg.default, (bwd,), seq_nr=8)
    graph.output(other)
    gm = module(graph)
    assert run(inherit_streams.PASS, gm, GraphCompile())
    gm.graph.lint()
    assert (stream_of(bwd), stream_of(other)) == (2, None)
    assert [r.pass_name for r in records(bwd)] == ["inherit_streams"]
    assert not run(inherit_streams.PASS, gm, GraphCompile()), "idempotent"


def test_a_stream_set_on_a_copy_leaves_its_original_alone() -> None:
    """``node_copy`` shares the ``custom`` dict and the pass records of a node's meta with
    its copy (a region module's nodes, the seeds Inductor copies): annotating one, or
    recording on it, must not change the other."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    original = node(graph, ops.aten.sin.default, (x,), stream=2)
    copy = graph.node_copy(original)
    assert copy.meta["custom"] is original.meta["custom"]
    set_stream(copy, 5)
    assert (stream_of(original), stream_of(copy)) == (2, 5)
    record(original, "inherit_streams", "on the original")
    copy = graph.node_copy(original)
    record(copy, "grad_accumulation", "on the copy")
    assert [r.pass_name for r in records(original)] == ["inherit_streams"]
    assert [r.pass_name for r in records(copy)] == ["inherit_streams", "grad_accumulation"]


def test_accumulation_follows_its_user_then_its_inputs() -> None:
    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    g1 = node(graph, ops.aten.neg.default, (a,), stream=1)
    g2 = node(graph, ops.aten.neg.default, (b,), stream=2)
    to_user = node(graph, ops.aten.add.Tensor, (g1, g2), is_gradient_acc=True)
    user = node(graph, ops.aten.mul.Tensor, (to_user, a), stream=3)
    to_output = node(graph, ops.aten.add.Tensor, (g2, g1), is_gradient_acc=True)
    graph.output((user, to_output))
    gm = module(graph)
    assert run(grad_accumulation.PASS, gm, GraphCompile())
    gm.graph.lint()
    assert stream_of(to_user) == 3, "rule 1: the stream of its user"
    assert stream_of(to_output) == 2, "rule 2: its first gradient input with a stream"


def test_backward_syncs_one_event_per_producer_one_wait_per_stream(
    compile_: GraphCompile,
) -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    producer = node(graph, ops.aten.sin.default, (x,), stream=0)
    on_1a = node(graph, ops.aten.cos.default, (producer,), stream=1)
    on_1b = node(graph, ops.aten.neg.default, (producer,), stream=1)
    on_2 = node(graph, ops.aten.exp.default, (producer,), stream=2)
    node(graph, ops.aten.abs.default, (producer,), stream=0)
    graph.output(None)  # nothing returned: no syncs at the graph's exit
    gm = module(graph)
    assert run(backward_syncs.PASS, gm, compile_)
    gm.graph.lint()
    (record,) = syncs(gm, ops.streams.record_event.default)
    waits = syncs(gm, ops.streams.wait_event.default)
    assert record.prev is producer and record.args[1] == 0
    assert [(w.next, w.args[1]) for w in waits] == [(on_1a, 1), (on_2, 2)]
    assert on_1b.prev is on_1a, "one wait per stream"
    assert {w.args[0] for w in waits} == {record.args[0]}
    assert [e.phase for e in compile_.table.entries[STREAMS:]] == [Phase.BACKWARD]
    assert [e.added_by for e in compile_.table.entries[STREAMS:]] == ["backward_syncs"]


def test_backward_syncs_name_the_current_stream_for_unannotated_nodes(
    compile_: GraphCompile,
) -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    producer = node(graph, ops.aten.sin.default, (x,))
    node(graph, ops.aten.cos.default, (producer,), stream=0)
    graph.output(None)
    gm = module(graph)
    run(backward_syncs.PASS, gm, compile_)
    (record,) = syncs(gm, ops.streams.record_event.default)
    current = compile_.table.entries[record.args[1]]
    assert current.origin == "current stream of cpu" and current.reader is Reader.ADDED_NODES


def test_backward_syncs_order_the_current_stream_at_the_graphs_edges(
    compile_: GraphCompile,
) -> None:
    """The engine runs the compiled backward on the current stream: another stream waits for
    it before reading an incoming gradient, and it waits for gradients made elsewhere."""
    graph = torch.fx.Graph()
    tangent = graph.placeholder("tangents_1")
    tangent.meta["val"] = VAL
    reads = node(graph, ops.aten.cos.default, (tangent,), stream=1)
    reads_again = node(graph, ops.aten.neg.default, (tangent,), stream=1)
    on_current = node(graph, ops.aten.abs.default, (tangent,))
    grad = node(graph, ops.aten.mul.Tensor, (reads, reads_again), stream=1)
    output = graph.output((grad, on_current))
    gm = module(graph)
    notes = run(backward_syncs.PASS, gm, compile_)
    gm.graph.lint()
    current = compile_.current_stream(torch.device("cpu"), added_by="test")
    entry_record, exit_record = syncs(gm, ops.streams.record_event.default)
    entry_wait, exit_wait = syncs(gm, ops.streams.wait_event.default)
    assert (entry_record.args[1], entry_wait.args[1]) == (current, 1)
    assert entry_record.next is entry_wait and entry_wait.next is reads
    assert entry_wait.args[0] == entry_record.args[0]
    assert (exit_record.prev, exit_record.args[1]) == (grad, 1)
    assert (exit_wait.next, exit_wait.args[1]) == (output, current)
    assert exit_wait.args[0] == exit_record.args[0] != entry_record.args[0]
    assert len(notes) == 4, "one wait per stream; nothing for work on the current stream"


def test_dealloc_sync_after_the_last_use_on_another_stream(compile_: GraphCompile) -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    made = node(graph, ops.aten.sin.default, (x,), stream=0)
    first_use = node(graph, ops.aten.cos.default, (made,), stream=0)
    last_use = node(graph, ops.aten.neg.default, (made,), stream=1)
    graph.output((first_use, last_use))
    gm = module(graph)
    assert run(dealloc_syncs.PASS, gm, compile_)
    gm.graph.lint()
    record = last_use.next
    dealloc = record.next
    assert record.target is ops.streams.record_event.default and record.args[1] == 1
    assert dealloc.target is ops.streams.sync_dealloc.default
    assert dealloc.args == (record.args[0], 0, made)
    assert not run(dealloc_syncs.PASS, module(_same_stream_graph()), compile_), "same stream"


def test_dealloc_sync_follows_reads_through_views(compile_: GraphCompile) -> None:
    """The last use of a tensor is its last read through any view of it (a multi-output
    view's getitems included): the sync used to land after the view, before the reads."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    made = node(graph, ops.aten.sin.default, (x,), stream=0)
    flat = node(graph, ops.aten.view.default, (made, [2]), stream=1)
    halves = node(graph, ops.aten.split.Tensor, (made, 1), stream=1)
    halves.meta["val"] = [VAL, VAL]
    first = node(graph, operator.getitem, (halves, 0), stream=1)
    second = node(graph, operator.getitem, (halves, 1), stream=1)
    reads = [node(graph, ops.aten.cos.default, (v,), stream=1) for v in (flat, first, second)]
    graph.output(tuple(reads))
    gm = module(graph)
    run(dealloc_syncs.PASS, gm, compile_)
    gm.graph.lint()
    (dealloc,) = syncs(gm, ops.streams.sync_dealloc.default)
    # One sync, on the stream that owns the memory, holding the view its last reader reads.
    assert dealloc.args[1:] == (0, second)
    assert dealloc.prev.target is ops.streams.record_event.default
    assert dealloc.prev.prev is reads[-1], "after the last read, not after a view"


def _same_stream_graph() -> torch.fx.Graph:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    made = node(graph, ops.aten.sin.default, (x,), stream=0)
    use = node(graph, ops.aten.neg.default, (made,), stream=0)
    graph.output(node(graph, ops.aten.cos.default, (use,), stream=0))
    return graph


needs_control_deps = pytest.mark.skipif(
    not hasattr(torch._functorch._aot_autograd.streams, "_wrap_sync_node"),
    reason="torch 2.11 does not wrap syncs in control_deps",
)


@needs_control_deps
def test_sync_ordering_keeps_forward_and_backward_dependencies_apart() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    fwd = node(graph, ops.aten.sin.default, (x,), stream=0, backward=False)
    bwd = node(graph, ops.aten.cos.default, (x,), stream=0)
    record = graph.call_function(ops.streams.record_event.default, (5, 0))
    record.meta["partitioner_tag"] = "must_be_in_backward"
    later = node(graph, ops.aten.neg.default, (bwd,), stream=0)
    graph.output((fwd, later))
    gm = module(graph)
    assert run(sync_ordering.WRAP, gm, GraphCompile())
    gm.graph.lint()
    (control,) = [n for n in gm.graph.nodes if "control_deps" in str(n.target)]
    assert list(control.args[0]) == [bwd], "depends on backward work only"
    assert control.meta["partitioner_tag"] == "must_be_in_backward"
    assert any(u.target is operator.getitem for u in control.users)


@needs_control_deps
def test_sync_ordering_pins_a_backward_syncs_re_exports_to_the_backward() -> None:
    """An operand computed from forward values alone (BatchNorm's backward unsqueezes the
    saved mean) is tagged ``is_backward`` only; torch 2.14+'s partitioner then took its
    re-export for a forward value and saved a value computed from it, which the forward
    cannot compute ("Node sub_1 was invalid, but is output"). The re-exports are pinned to
    the backward; the operand itself stays free to be saved."""
    graph = torch.fx.Graph()
    mean, grad = graph.placeholder("mean"), graph.placeholder("tangents_1")
    view = node(graph, ops.aten.unsqueeze.default, (mean, 0), stream=0)
    summed = node(graph, ops.aten.sum.default, (grad,), stream=0)
    record = graph.call_function(ops.streams.record_event.default, (5, 0))
    record.meta["partitioner_tag"] = "must_be_in_backward"
    later = node(graph, ops.aten.sub.Tensor, (view, summed), stream=0)
    graph.output((later,))
    gm = module(graph)
    assert run(sync_ordering.WRAP, gm, GraphCompile())
    (control,) = [n for n in gm.graph.nodes if "control_deps" in str(n.target)]
    assert list(control.args[0]) == [view, summed]
    re_exports = [user for user in control.users if user.target is operator.getitem]
    assert {user.args[1] for user in re_exports} == {1, 2}, "both operands are re-exported"
    assert {n.meta["partitioner_tag"] for n in (control, *re_exports)} == {"must_be_in_backward"}
    assert view.meta["partitioner_tag"] == "is_backward"


@needs_control_deps
@pytest.mark.parametrize(
    ("layout", "dep"),
    [
        # The read part is walked first, on the record's stream: the record follows the
        # tuple through it, and not through the unread part, whose subgraph output
        # AOTAutograd may drop.
        ("read part first", "read"),
        # Otherwise the unread part is the record's only way to follow the tuple.
        ("read part after the record", "unread"),
        ("read part on another stream", "unread"),
    ],
)
def test_sync_ordering_follows_a_tuple_through_one_part(layout: str, dep: str) -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    pair = node(graph, ops.aten.var_mean.correction, (x,), stream=1, backward=False)
    pair.meta["val"] = (VAL, VAL)

    def part(index: int, stream: int) -> torch.fx.Node:
        return node(graph, operator.getitem, (pair, index), stream=stream, backward=False)

    def record() -> None:
        graph.call_function(ops.streams.record_event.default, (0, 1)).meta.update(
            partitioner_tag="is_forward"
        )

    if layout == "read part after the record":
        unread = part(1, stream=1)
        record()
        read = part(0, stream=1)
    else:
        read = part(0, stream=2 if layout == "read part on another stream" else 1)
        unread = part(1, stream=1)
        record()
    graph.output((node(graph, ops.aten.neg.default, (read,), backward=False),))
    gm = module(graph)
    assert run(sync_ordering.WRAP, gm, GraphCompile())
    (control,) = [n for n in gm.graph.nodes if "control_deps" in str(n.target)]
    assert list(control.args[0]) == [{"read": read, "unread": unread}[dep]]


def test_a_pass_run_before_what_it_requires_fails_naming_both() -> None:
    graph = torch.fx.Graph()
    graph.output(graph.placeholder("x"))
    gm = module(graph)
    with pytest.raises(PassContractError, match=r"backward_syncs requires .*accumulations placed"):
        run_passes(gm, [backward_syncs.PASS], GraphCompile())
    compile_ = GraphCompile()
    passes = [backward_phase, inherit_streams, grad_accumulation, backward_syncs]
    run_passes(gm, [p.PASS for p in passes], compile_)
    # an empty graph: each pass ran and ensured its fact, and none changed anything
    # kept in the order ensured: the graph's meta is part of Inductor's cache key
    assert list(gm.meta[FACTS]) == [
        Fact.PHASES_TAGGED,
        Fact.BACKWARD_STREAMS_INHERITED,
        Fact.ACCUMULATIONS_PLACED,
        Fact.BACKWARD_READS_SYNCED,
    ]
    assert compile_.table.pass_notes == []
