"""Phase tags for what a custom ``autograd.Function``'s backward traces into the joint graph.

AOTAutograd tags the nodes of the forward as forward once the forward is traced, and tags
backward nodes through the meta it holds while autograd runs the backward. A custom
Function's backward is replayed with the meta of the nodes Dynamo traced for it, which has
no tag: its ops, its syncs and anything under a ``with stream:`` in it reach the joint graph
untagged, and an untagged node looked forward to every later pass. A sync there ran in the
forward call; a stream context there made the partitioner reject the graph ("Node ... was
invalid, but is output").

Rule: AOTAutograd tags every node of the joint graph once the forward is traced (forward,
or backward for a tangent), so an untagged ``call_function`` node after the last forward
node was traced by the backward. It gets the backward's tag, and the later passes treat it
as they treat the rest of the backward (``inherit_streams`` gives it the stream of its
forward node, as eager runs a custom backward on that stream). A custom backward may be the
first thing the backward runs (the compiled function returns the Function's output): no
backward ``call_function`` precedes it, so the rule cannot wait for one. A graph with no
backward (no tangent, no backward node) is left alone.

Exception: AOTAutograd replays, after the backward, the views the function returns of an
input it updated in place (``x += t; return x[1:]``): the output is rebuilt as a view of the
updated value. Such a node is a view of a forward node the graph returns or copies into the
input (the new value), feeds only the graph's outputs and has no stream: it is a forward
output, tagged forward and moved to the end of the forward. Tagged backward, or left
among the backward's syncs, it was made to wait for the backward, and the partitioner
rejected the graph ("Node ... was invalid, but is output").
"""

from __future__ import annotations

import torch.fx

from ..compile.contract import Fact, GraphPass
from ..compile.graph_compile import GraphCompile
from ..fx.meta import IS_BACKWARD, IS_FORWARD, PARTITIONER_TAG, is_backward, record, stream_of

NAME = "backward_phase"


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    nodes = list(gm.graph.nodes)
    if not any(is_backward(node) for node in nodes):
        return []
    forward = [i for i, node in enumerate(nodes) if node.meta.get(PARTITIONER_TAG) == IS_FORWARD]
    untagged = [
        node
        for node in nodes[forward[-1] + 1 if forward else 0 :]
        if node.op == "call_function" and node.meta.get(PARTITIONER_TAG) is None
    ]
    rebuilt = _rebuilt_forward_outputs(untagged)
    notes = []
    last_forward = nodes[forward[-1]] if forward else None
    for node in untagged:
        if node in rebuilt and last_forward is not None:
            node.meta[PARTITIONER_TAG] = IS_FORWARD
            last_forward.append(node)  # back into the forward, in order: reads only it
            last_forward = node
            note = record(node, NAME, "rebuilds a forward output: moved into the forward")
            notes.append(f"{note.note} [{node.name}]")
        else:
            node.meta[PARTITIONER_TAG] = IS_BACKWARD
            notes.append(f"{record(node, NAME, 'traced in a custom backward').note} [{node.name}]")
    return notes


def _rebuilt_forward_outputs(untagged: list[torch.fx.Node]) -> set[torch.fx.Node]:
    """The untagged views whose base is a graph output made by the forward (the updated
    input's new value) or another such view, that feed only the graph's outputs or other
    such views, and have no stream. A custom backward's node that computes from forward
    values is not one. One that returns a view of a saved forward output (``y.t()``) looks
    like one and moves into the forward: harmless, a view reads no data, so no join it
    skipped could have ordered it."""
    output = next(iter(untagged[0].graph.find_nodes(op="output"))) if untagged else None
    outputs = set(output.all_input_nodes) if output is not None else set()
    # An input updated inside the graph gets its new value by a ``copy_`` there, not as an
    # output (``keep_inference_input_mutations``).
    copy_ = torch.ops.aten.copy_.default
    for graph in {node.graph for node in untagged}:
        for node in graph.find_nodes(op="call_function", target=copy_):
            if isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder":
                outputs.add(node.args[1])  # type: ignore[arg-type]
    views: set[torch.fx.Node] = set()
    for node in untagged:
        target = node.target
        if not (isinstance(target, torch._ops.OpOverload) and target.is_view):
            continue
        base = node.args[0] if node.args else None
        forward_output = (
            isinstance(base, torch.fx.Node)
            and base.meta.get(PARTITIONER_TAG) == IS_FORWARD
            and base in outputs
        )
        if (forward_output or base in views) and stream_of(node) is None:
            views.add(node)
    rebuilt: set[torch.fx.Node] = set()
    for node in reversed(untagged):
        if node in views and node.users:
            if all(user.op == "output" or user in rebuilt for user in node.users):
                rebuilt.add(node)
    return rebuilt


PASS = GraphPass(NAME, run, ensures=frozenset({Fact.PHASES_TAGGED}))
