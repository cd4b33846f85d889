"""``inductor.early_values``: which values move up to what they read, on hand-built graphs
(streams 1 and 2 side streams, None the stream the call began on; event 0), and what a move
keeps, over generated graphs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx
from helpers import demo_step_kernels
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_userstreams.backends.inductor_graphs import inductor_runs_streams
from torch_userstreams.fx.meta import set_stream, stream_of
from torch_userstreams.inductor.early_values import computed_early

aten, streams = torch.ops.aten, torch.ops.streams


class Builder:
    """An FX graph of ops on streams, built in program order."""

    def __init__(self) -> None:
        self.graph = torch.fx.Graph()
        self.x = self.graph.placeholder("x")

    def op(self, target: Any, *args: Any, stream: int | None = None) -> torch.fx.Node:
        node = self.graph.call_function(target, args)
        if stream is not None:
            set_stream(node, stream)
        return node

    def record(self, stream: int) -> torch.fx.Node:
        return self.op(streams.record_event.default, 0, stream)

    def wait(self, stream: int) -> torch.fx.Node:
        return self.op(streams.wait_event.default, 0, stream)

    def module(self, *outputs: torch.fx.Node) -> torch.fx.GraphModule:
        self.graph.output(outputs)
        return torch.fx.GraphModule(torch.nn.Module(), self.graph)


class WithoutSyncs(torch.fx.Interpreter):
    """Runs a graph's ops on CPU, its syncs as no-ops: the values alone."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target in (streams.record_event.default, streams.wait_event.default):
            return None
        return super().call_function(target, args, kwargs)


def order(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "call_function"]


def assert_nothing_moves(gm: torch.fx.GraphModule) -> None:
    """No node of ``gm`` moves, and its order stays as built."""
    before = order(gm)
    assert computed_early(gm) == []
    assert order(gm) == before


def test_a_mask_after_the_syncs_moves_up_to_what_it_reads() -> None:
    """The partitioner's place for a ReLU's mask: after every sync of the forward."""
    b = Builder()
    relu = b.op(aten.relu.default, b.x, stream=1)
    record, wait = b.record(1), b.wait(2)
    other = b.op(aten.cos.default, b.x, stream=2)
    mask = b.op(aten.le.Scalar, relu, 0, stream=1)
    total = b.op(aten.sum.default, mask, stream=1)
    gm = b.module(other, mask, total)
    assert computed_early(gm) == [mask, total]
    assert order(gm) == [n.name for n in (relu, mask, total, record, wait, other)]
    assert (stream_of(mask), stream_of(total)) == (1, 1)


def test_a_value_that_reads_another_streams_work_or_an_input_keeps_its_place() -> None:
    """What another stream made is ordered by the waits it would pass; an input, by the
    stream's first wait."""
    b = Builder()
    side = b.op(aten.relu.default, b.x, stream=2)
    mine = b.op(aten.relu.default, b.x, stream=1)
    b.record(2)
    b.wait(1)
    mixed = b.op(aten.add.Tensor, mine, side, stream=1)
    of_input = b.op(aten.cos.default, b.x, stream=1)
    gm = b.module(mixed, of_input)
    assert_nothing_moves(gm)


def test_a_value_passes_no_write_nor_draws_random_numbers() -> None:
    b = Builder()
    relu = b.op(aten.relu.default, b.x, stream=1)
    b.record(1)
    b.op(aten.add_.Tensor, relu, relu, stream=1)  # writes what the mask reads
    mask = b.op(aten.le.Scalar, relu, 0, stream=1)
    b.record(1)
    noise = b.op(aten.rand_like.default, mask, stream=1)
    gm = b.module(mask, noise)
    assert_nothing_moves(gm)


def test_a_value_with_no_sync_nor_other_stream_before_it_stays() -> None:
    """Inductor fuses it where it is: the graph is left as it was."""
    b = Builder()
    relu = b.op(aten.relu.default, b.x, stream=1)
    b.op(aten.mm.default, relu, relu, stream=1)
    mask = b.op(aten.le.Scalar, relu, 0, stream=1)
    gm = b.module(mask)
    assert_nothing_moves(gm)


# A generated program: each step an op on a stream (None, 1 or 2) reading earlier values, or
# a record or wait of event 0 on a stream.
OPS: list[tuple[str, Callable[..., Any], int]] = [
    ("cos", aten.cos.default, 1),
    ("relu", aten.relu.default, 1),
    ("mul", aten.mul.Tensor, 2),
    ("add", aten.add.Tensor, 2),
    ("sum", aten.sum.dim_IntList, 1),
    ("mm", aten.mm.default, 2),
]
step = st.one_of(
    st.tuples(
        st.just("op"),
        st.integers(0, len(OPS) - 1),
        st.sampled_from([None, 1, 2]),
        st.lists(st.integers(0, 99), min_size=2, max_size=2),
    ),
    st.tuples(st.sampled_from(["record", "wait"]), st.sampled_from([1, 2])),
)


def build(steps: list[Any]) -> torch.fx.GraphModule:
    b = Builder()
    values: list[torch.fx.Node] = [b.x]
    for s in steps:
        if s[0] != "op":
            (b.record if s[0] == "record" else b.wait)(s[1])
            continue
        _, which, stream, picks = s
        name, target, arity = OPS[which]
        reads = [values[p % len(values)] for p in picks[:arity]]
        extra = ([0], True) if name == "sum" else ()
        node = b.op(target, *reads, *extra, stream=stream)
        if name != "sum":  # (a sum's [1, 4] stays out of later ops: shapes stay [4, 4])
            values.append(node)
    return b.module(*values[1:])


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=14))
def test_a_move_keeps_values_and_every_other_nodes_order(steps: list[Any]) -> None:
    """Values are those of the graph as built; the nodes that did not move (every sync
    among them) keep their order; a node that moved reads only what its own stream made,
    and sits right after the last of it, or right after a node that moved before it."""
    gm = build(steps)
    x = torch.randn(4, 4)
    expected = WithoutSyncs(gm).run(x)
    was = order(gm)
    moved = computed_early(gm)
    gm.graph.lint()
    torch.testing.assert_close(WithoutSyncs(gm).run(x), expected)
    names = {n.name for n in moved}
    assert [n for n in order(gm) if n not in names] == [n for n in was if n not in names]
    for node in moved:
        reads = node.all_input_nodes
        assert all(r.op == "call_function" and stream_of(r) == stream_of(node) for r in reads)
        assert node.prev in reads or node.prev in moved


@pytest.mark.skipif(
    inductor_runs_streams(),
    reason="the move runs where the package places the nodes on their streams (torch 2.11); "
    "Inductor 2.12+ places them itself",
)
def test_the_demo_steps_bias_sums_are_computed_in_their_operands_kernels() -> None:
    """The backward records an event as each gradient is made: without the move, each bias's
    gradient (a sum) came after its weight's record and ran as a C++ kernel of its own
    (three of them in the demo's backward)."""
    import re

    kernels = demo_step_kernels()
    assert any("sum" in k for k in kernels), kernels
    assert not [k for k in kernels if re.fullmatch(r"cpp_fused_sum_\d+", k)], kernels
