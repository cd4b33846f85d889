"""Stream inheritance: a backward node runs on the stream of the forward node it differentiates.

Rule: a backward node without a stream takes the stream of the forward node with the same
autograd sequence number (``seq_nr``), as eager autograd runs each backward function on the
stream its forward ran on. Nodes that already carry a stream (AOTAutograd copies forward
metadata for most of them) are left alone, so the pass is idempotent.
"""

from __future__ import annotations

import torch.fx

from ..compile.contract import Fact, GraphPass
from ..compile.graph_compile import GraphCompile
from ..fx.meta import SEQ_NR, is_backward, record, set_stream, stream_of

NAME = "inherit_streams"


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    forward_stream: dict[int, int] = {}
    for node in gm.graph.nodes:
        seq_nr = node.meta.get(SEQ_NR)
        index = stream_of(node)
        if not is_backward(node) and seq_nr is not None and index is not None:
            forward_stream.setdefault(seq_nr, index)
    notes = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or not is_backward(node) or stream_of(node) is not None:
            continue
        index = forward_stream.get(node.meta.get(SEQ_NR, -1))
        if index is not None:
            set_stream(node, index)
            note = record(node, NAME, f"runs on stream {index} like its forward node")
            notes.append(f"{note.note} [{node.name}]")
    return notes


PASS = GraphPass(
    NAME,
    run,
    requires=frozenset({Fact.PHASES_TAGGED}),
    ensures=frozenset({Fact.BACKWARD_STREAMS_INHERITED}),
)
