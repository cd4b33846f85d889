"""Memory safety across streams: no reuse of a tensor's memory before its last use is done.

The caching allocator ties a block to the stream it was allocated on: once the tensor dies,
later allocations on that stream may reuse the block at once, even while another stream
still reads it. Rule (deterministic, no runtime estimates, no triton): a tensor allocated on
stream A dies in the phase of its last use: the backward if a backward node uses it (the
forward graph saves it), else the forward. For each other stream B that uses it in that
phase, record an event on B right after B's last use there, then
``streams::sync_dealloc(event, A, tensor)`` right after it: A waits for the event, and the
tensor is held until then, so A's later allocations cannot reuse it early. This gives up
some overlap on A after the last use (native estimates how long it can delay the wait).

A forward tensor that crosses streams and is used by the backward is marked must-save: the
partitioner then keeps it alive until the backward instead of computing it again there,
where its new allocation would have none of the syncs above.

Limits: tensors that escape as graph outputs are owned by the caller and skipped; uses
through views count only through the view's own users; a saved tensor's forward uses on
other streams are not synced again in the backward.
"""

from __future__ import annotations

import torch
import torch.fx
from torch.utils.checkpoint import CheckpointPolicy

from .. import api
from ..table import Phase
from .annotations import (
    event_device,
    is_backward,
    mark_phase,
    record,
    stream_index,
    stream_of,
)
from .backward_syncs import is_sync

PASS_NAME = "dealloc_syncs"


def _dies_in_backward(node: torch.fx.Node) -> bool:
    return is_backward(node) or any(is_backward(user) for user in node.users)


def _last_use_on_other_streams(
    node: torch.fx.Node, order: dict[torch.fx.Node, int]
) -> list[torch.fx.Node]:
    """For each stream other than ``node``'s that uses it in the phase it dies in, that
    stream's last user there."""
    if any(user.op == "output" for user in node.users):
        return []
    backward = _dies_in_backward(node)
    last: dict[int | None, torch.fx.Node] = {}
    for user in sorted(node.users, key=order.__getitem__):
        if is_backward(user) == backward and stream_of(user) != stream_of(node):
            last[stream_of(user)] = user
    return list(last.values())


def _crosses_streams(node: torch.fx.Node) -> bool:
    return any(stream_of(user) != stream_of(node) for user in node.users)


def sync_deallocations(gm: torch.fx.GraphModule) -> bool:
    """Returns whether any dealloc sync was inserted."""
    graph = gm.graph
    order = {node: i for i, node in enumerate(graph.nodes)}
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or is_sync(node):
            continue
        if not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        if not is_backward(node) and _dies_in_backward(node) and _crosses_streams(node):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        for last in _last_use_on_other_streams(node, order):
            device = event_device(node, last, node)
            if device is not None:
                _insert_dealloc_sync(graph, node, last, device)
                changed = True
    return changed


def _insert_dealloc_sync(
    graph: torch.fx.Graph, node: torch.fx.Node, last: torch.fx.Node, device: torch.device
) -> None:
    backward = is_backward(last)
    event = api.new_event(device, phase=Phase.BACKWARD if backward else Phase.FORWARD)
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
        mark_phase(added, backward)
        record(added, PASS_NAME, note)
