"""Memory safety across streams: no reuse of a tensor's memory before its last use is done.

The caching allocator ties a block to the stream it was allocated on: once the tensor dies,
later allocations on that stream may reuse the block at once, even while another stream
still reads it. Rule (deterministic, no runtime estimates, no triton): for a backward tensor
allocated on stream A and each other stream B that uses it, record an event on B right after
B's last use, then ``streams::sync_dealloc(event, A, tensor)`` right after it: A waits for
the event, and the tensor is held until then, so A's later allocations cannot reuse it
early. This gives up some overlap on A after the last use (native estimates how long it can
delay the wait). Limits: tensors that escape as graph outputs are owned by the autograd
engine and skipped; uses through views count only through the view's own users.
"""

from __future__ import annotations

import torch
import torch.fx

from .. import api
from .annotations import (
    event_device,
    is_backward,
    mark_backward,
    record,
    stream_index,
    stream_of,
)
from .backward_syncs import is_sync

PASS_NAME = "dealloc_syncs"


def _last_use_on_other_streams(
    node: torch.fx.Node, order: dict[torch.fx.Node, int]
) -> list[torch.fx.Node]:
    """For each stream other than ``node``'s that uses it, that stream's last user."""
    if any(user.op == "output" for user in node.users):
        return []
    last: dict[int | None, torch.fx.Node] = {}
    for user in sorted(node.users, key=order.__getitem__):
        if stream_of(user) != stream_of(node):
            last[stream_of(user)] = user
    return list(last.values())


def sync_deallocations(gm: torch.fx.GraphModule) -> bool:
    """Returns whether any dealloc sync was inserted."""
    graph = gm.graph
    order = {node: i for i, node in enumerate(graph.nodes)}
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or not is_backward(node) or is_sync(node):
            continue
        if not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        for last in _last_use_on_other_streams(node, order):
            device = event_device(node, last, node)
            if device is not None:
                _insert_dealloc_sync(graph, node, last, device)
                changed = True
    return changed


def _insert_dealloc_sync(
    graph: torch.fx.Graph, node: torch.fx.Node, last: torch.fx.Node, device: torch.device
) -> None:
    event = api.new_event(device, phase="backward")
    with graph.inserting_after(last):
        recorded = graph.call_function(
            torch.ops.streams.record_event.default, (event, stream_index(last))
        )
    with graph.inserting_after(recorded):
        waited = graph.call_function(
            torch.ops.streams.sync_dealloc.default, (event, stream_index(node), node)
        )
    for added, note in (
        (recorded, f"after the last use of {node.name} on its stream ({last.name})"),
        (waited, f"{node.name}'s stream waits before reusing its memory"),
    ):
        mark_backward(added)
        record(added, PASS_NAME, note)
