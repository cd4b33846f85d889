"""Gradient accumulation: which stream sums the gradients of a value used on several streams.

Rule, in order: (1) the stream of the first user of the accumulation that has one — eager's
input buffer accumulates on the consumer's stream; (2) else the stream of its first gradient
input (left to right) that has one; (3) else the current stream. Where the FX graph has no
node for the consumer (a parameter's ``AccumulateGrad`` is outside the graph; its gradient is
a graph output), rule (2) applies, which differs from eager when the gradient inputs come from
different streams: eager would use the stream of the leaf's ``AccumulateGrad``. The syncs pass
then makes the accumulation wait for every input produced on another stream.
"""

from __future__ import annotations

import torch.fx

from ..compile.contract import Fact, GraphPass
from ..compile.graph_compile import GraphCompile
from ..fx.meta import is_gradient_accumulation, record, set_stream, stream_of

NAME = "grad_accumulation"


def _chosen_stream(node: torch.fx.Node) -> tuple[int, str] | None:
    for user in node.users:
        index = stream_of(user)
        if index is not None:
            return index, f"its user {user.name}"
    for arg in node.all_input_nodes:
        index = stream_of(arg)
        if index is not None:
            return index, f"its gradient input {arg.name}"
    return None


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    """Runs in reverse so users are decided first."""
    notes = []
    for node in reversed(list(gm.graph.nodes)):
        if not is_gradient_accumulation(node) or stream_of(node) is not None:
            continue
        chosen = _chosen_stream(node)
        if chosen is not None:
            index, why = chosen
            set_stream(node, index)
            note = record(node, NAME, f"accumulates on stream {index}, the stream of {why}")
            notes.append(f"{note.note} [{node.name}]")
    return notes


PASS = GraphPass(
    NAME,
    run,
    requires=frozenset({Fact.BACKWARD_STREAMS_INHERITED}),
    ensures=frozenset({Fact.ACCUMULATIONS_PLACED}),
)
