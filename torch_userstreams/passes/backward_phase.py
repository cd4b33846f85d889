"""Phase tags for what a custom ``autograd.Function``'s backward traces into the joint graph.

AOTAutograd tags the nodes of the forward as forward once the forward is traced, and tags
backward nodes through the meta it holds while autograd runs the backward. A custom
Function's backward is replayed with the meta of the nodes Dynamo traced for it, which has
no tag: its ops, its syncs and anything under a ``with stream:`` in it reach the joint graph
untagged, and an untagged node looked forward to every later pass. A sync there ran in the
forward call; a stream context there made the partitioner reject the graph ("Node ... was
invalid, but is output").

Rule: the joint graph holds the forward, then the backward, so an untagged ``call_function``
node after the first backward node belongs to the backward. It gets the backward's tag, and
the later passes treat it as they treat the rest of the backward (``inherit_streams`` gives
it the stream of its forward node, as eager runs a custom backward on that stream).
"""

from __future__ import annotations

import torch.fx

from ..compile.graph_compile import GraphCompile
from ..fx.meta import PARTITIONER_TAG, is_backward
from .contract import GraphPass

NAME = "backward_phase"
BACKWARD = "is_backward"


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    notes = []
    in_backward = False
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if in_backward and node.meta.get(PARTITIONER_TAG) is None:
            node.meta[PARTITIONER_TAG] = BACKWARD
            notes.append(f"traced in a custom backward [{node.name}]")
        in_backward = in_backward or is_backward(node)
    return notes


PASS = GraphPass(NAME, run, ensures=frozenset({"phases tagged"}))
