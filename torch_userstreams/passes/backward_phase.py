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
"""

from __future__ import annotations

import torch.fx

from ..compile.graph_compile import GraphCompile
from ..fx.meta import IS_BACKWARD, IS_FORWARD, PARTITIONER_TAG, is_backward
from .contract import GraphPass

NAME = "backward_phase"


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    nodes = list(gm.graph.nodes)
    if not any(is_backward(node) for node in nodes):
        return []
    forward = [i for i, node in enumerate(nodes) if node.meta.get(PARTITIONER_TAG) == IS_FORWARD]
    notes = []
    for node in nodes[forward[-1] + 1 if forward else 0 :]:
        if node.op == "call_function" and node.meta.get(PARTITIONER_TAG) is None:
            node.meta[PARTITIONER_TAG] = IS_BACKWARD
            notes.append(f"traced in a custom backward [{node.name}]")
    return notes


PASS = GraphPass(NAME, run, ensures=frozenset({"phases tagged"}))
