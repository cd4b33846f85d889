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

A forward tensor that crosses streams and is used by the backward (itself or through a view)
is marked must-save: the partitioner then keeps it alive until the backward instead of
computing it again there, where its new allocation would have none of the syncs above. So is
a forward tensor that reads a value made on another stream: computed again in the backward,
it would read that value without the forward's sync (torch 2.11, which does not wrap syncs
in ``control_deps``, let the min-cut partitioner recompute such a chain). A must-save tensor
the backward does not use is not saved.

An incoming gradient (a tangent) is allocated on the current stream and dies in the
backward: read on another stream, it gets the same sync.

Uses through views (a ``getitem`` of ``split`` included) count as uses of the viewed tensor:
the view keeps its memory alive. The sync holds the value its last reader reads, the tensor
or its view: in the backward, the saved view the backward graph has. An inference graph has
no backward phase, whatever its nodes' tags say.

Limits: tensors that escape as graph outputs (directly or through a view) are owned by the
caller and skipped; a saved tensor's forward uses on other streams are not synced again in
the backward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx
from torch.utils.checkpoint import CheckpointPolicy

from ..compile.contract import Fact, GraphPass
from ..compile.graph_compile import GraphCompile
from ..fx.meta import is_backward, is_tangent, stream_of
from ..fx.ops import is_sync_op, is_view, made_by
from ..fx.record_and_wait import insert_record_and_wait
from .devices import event_device, new_event, stream_index

NAME = "dealloc_syncs"


def _dies_in_backward(node: torch.fx.Node) -> bool:
    """Whether the backward reads ``node``'s memory, itself or through a view (AOTAutograd
    2.11 hands the backward a forward value through an ``alias``)."""
    return is_backward(node) or any(is_backward(reader) for reader in _reads(node))


def _reads(node: torch.fx.Node) -> dict[torch.fx.Node, torch.fx.Node]:
    """Each node that reads ``node``'s memory, with the value it reads it through: ``node``
    or a view of it (a view reads nothing itself, but keeps the memory alive)."""
    found: dict[torch.fx.Node, torch.fx.Node] = {}
    for user in node.users:
        if user.op == "call_function" and is_view(user):
            for reader, through in _reads(user).items():
                found.setdefault(reader, through)
        else:
            found.setdefault(user, node)
    return found


Phase = Callable[[torch.fx.Node], bool]  # whether a node runs in the backward


def _last_reads_on_other_streams(
    node: torch.fx.Node, order: dict[torch.fx.Node, int], backward: Phase
) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """For each stream other than ``node``'s that reads it in the phase it dies in, that
    stream's last reader there and the value it reads (``node`` or a view of it: in the
    backward, the saved view is the one the backward graph holds)."""
    reads = _reads(node)
    if any(reader.op == "output" for reader in reads):
        return []
    dies_in_backward = backward(node) or any(backward(reader) for reader in reads)
    last: dict[int | None, tuple[torch.fx.Node, torch.fx.Node]] = {}
    for reader in sorted(reads, key=order.__getitem__):
        if backward(reader) == dies_in_backward and stream_of(reader) != stream_of(node):
            last[stream_of(reader)] = (reader, reads[reader])
    return list(last.values())


def _crosses_streams(node: torch.fx.Node) -> bool:
    return any(stream_of(user) != stream_of(node) for user in node.users)


def _reads_another_stream(node: torch.fx.Node) -> bool:
    if is_view(node):
        return False  # its first non-view reader is the one to save
    for used in node.all_input_nodes:
        maker = made_by(used)
        if maker.op == "call_function" and not is_backward(maker):
            if stream_of(maker) != stream_of(node):
                return True
    return False


def _must_save(node: torch.fx.Node) -> bool:
    """A forward tensor the backward must not compute again (see the module docstring)."""
    if is_backward(node):
        return False
    return (_dies_in_backward(node) and _crosses_streams(node)) or _reads_another_stream(node)


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    graph = gm.graph
    order = {node: i for i, node in enumerate(graph.nodes)}
    # An inference graph has no backward, whatever its tags say: its epilogue copy into a
    # mutated input is tagged ``must_be_in_backward``.
    joint = any(is_tangent(node) for node in graph.nodes)

    def backward(node: torch.fx.Node) -> bool:
        return joint and is_backward(node)

    notes: list[str] = []
    for node in list(graph.nodes):
        if not (node.op == "call_function" or is_tangent(node)) or is_sync_op(node.target):
            continue
        if not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        if node.op == "call_function" and _must_save(node):
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE
        if node.op == "call_function" and is_view(node):
            continue  # it allocates nothing: its readers count for the tensor it views
        for last, through in _last_reads_on_other_streams(node, order, backward):
            device = event_device(node, last, node, compile_)
            if device is not None:
                phase = backward(last)
                notes += _insert_dealloc_sync(graph, node, through, last, device, compile_, phase)
    return notes


def _insert_dealloc_sync(
    graph: torch.fx.Graph,
    node: torch.fx.Node,
    through: torch.fx.Node,
    last: torch.fx.Node,
    device: torch.device,
    compile_: GraphCompile,
    backward: bool,
) -> list[str]:
    """After ``last`` reads ``node``'s memory (through ``through``) on its stream: an event
    there, and ``node``'s stream waits for it holding ``through`` until then."""
    return insert_record_and_wait(
        graph,
        last,
        after=True,
        event=new_event(compile_, device, added_by=NAME, backward=backward),
        recorded_on=stream_index(last, compile_, NAME),
        waiting=stream_index(node, compile_, NAME),
        holds=through,
        by=NAME,
        why=(
            f"after the last use of {node.name} on its stream ({last.name})",
            f"{node.name}'s stream waits before reusing its memory",
        ),
        backward=backward,
    )


PASS = GraphPass(
    NAME,
    run,
    requires=frozenset({Fact.BACKWARD_READS_SYNCED, Fact.WRITE_BACKS_IN_PLACE}),
    ensures=frozenset({Fact.SYNCS_COMPLETE}),
    needs_compile=True,
)
