"""Stream inheritance: a backward node runs on the stream of the forward node it differentiates.

Rule: a backward node without a stream takes the stream of the forward node with the same
autograd sequence number (``seq_nr``), as eager autograd runs each backward function on the
stream its forward ran on. Nodes that already carry a stream (AOTAutograd copies forward
metadata for most of them) are left alone, so the pass is idempotent.
"""

from __future__ import annotations

import torch.fx

from .annotations import is_backward, record, set_stream, stream_of

PASS_NAME = "inherit_streams"


def inherit_streams(gm: torch.fx.GraphModule) -> bool:
    """Returns whether any node changed."""
    forward_stream: dict[int, int] = {}
    for node in gm.graph.nodes:
        seq_nr = node.meta.get("seq_nr")
        index = stream_of(node)
        if not is_backward(node) and seq_nr is not None and index is not None:
            forward_stream.setdefault(seq_nr, index)
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or not is_backward(node) or stream_of(node) is not None:
            continue
        index = forward_stream.get(node.meta.get("seq_nr", -1))
        if index is not None:
            set_stream(node, index)
            record(node, PASS_NAME, f"runs on stream {index} like its forward node")
            changed = True
    return changed
