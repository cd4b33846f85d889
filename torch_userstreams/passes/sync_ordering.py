"""Pin sync nodes in place with ``control_deps``, forward and backward kept apart.

Compilers may reorder nodes that have no data dependency, and a sync has none. AOTAutograd
(2.12+) wraps each sync in a ``control_deps`` node that depends on the work before it on the
same stream. Its walk puts forward and backward nodes into the same per-stream buckets, so a
backward sync ends up depending on forward values and the partitioner rejects the graph
("control_deps was invalid, but is output"). Rule here: the same wrapping, with one set of
buckets per phase, so a sync depends only on earlier work of its own phase. ``record_event``
and ``wait_event`` depend on their stream's work (and the unannotated current stream's); a
wait also depends on its record; any other sync is a barrier over all streams of its phase.
A sync that carries its tensor (``sync_dealloc``, ``record_stream``) is ordered by it and
not wrapped.

Before that, ``pin_syncs`` tags every sync with its phase (``fx.meta.mark_phase``).
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from ..compile.contract import Fact, GraphPass
from ..compile.graph_compile import GraphCompile
from ..fx.meta import (
    IS_BACKWARD,
    PARTITIONER_TAG,
    is_backward,
    is_tangent,
    mark_phase,
    record,
    stream_of,
)
from ..fx.ops import is_sync_op, op_name

NAME = "sync_ordering"
PIN_NAME = "pin_syncs"
Buckets = dict[int | None, list[torch.fx.Node]]
AC_TAGS = ("recompute", "ac_graph_id")  # what torch.utils.checkpoint's tracing sets
_CARRY_THEIR_TENSOR = frozenset({"sync_dealloc", "record_stream"})


def _orders_nothing_by_data(node: torch.fx.Node) -> bool:
    return is_sync_op(node.target) and op_name(node.target) not in _CARRY_THEIR_TENSOR


def _deps(
    node: torch.fx.Node,
    buckets: Buckets,
    records: dict[int, torch.fx.Node],
    read_after: list[torch.fx.Node],
) -> list:
    ops = torch.ops.streams
    if node.target in (ops.record_event.default, ops.wait_event.default):
        stream = node.args[1]
        deps = list(buckets.get(stream, ()))  # type: ignore[call-overload,arg-type]
        if stream is not None:
            deps += buckets.get(None, [])
        record = records.get(node.args[0])  # type: ignore[arg-type]
        if node.target is ops.wait_event.default:
            if record is not None:
                deps.insert(0, record)
            deps += [value for value in read_after if value not in deps]
        buckets[stream] = []  # type: ignore[index]
        buckets[None] = []
        return deps
    deps = [n for nodes in buckets.values() for n in nodes]
    buckets.clear()
    return deps


def _keep_in_phase(control: torch.fx.Node, backward: bool) -> None:
    """The partitioner must keep a wrapped sync (and what re-exports it) in its own graph.

    A backward re-export is pinned even when AOTAutograd tagged it ``is_backward``: torch
    2.14+'s partitioner counts a re-export as backward-only only when its operand is, and an
    operand computed from saved values alone (BatchNorm's backward unsqueezes the saved
    mean) is not, so it saved a value computed from the re-export, which the forward cannot
    compute ("Node sub_1 was invalid, but is output"). The operand stays free to be saved."""
    for node in (control, *control.all_input_nodes, *control.users):
        tag = node.meta.get(PARTITIONER_TAG)
        re_export = backward and tag == IS_BACKWARD and node in control.users
        if node.op in ("get_attr", "call_function") and (tag is None or re_export):
            mark_phase(node, backward)
    mark_phase(control, backward)


def _multi_output(node: torch.fx.Node) -> bool:
    """A node whose value is a tuple (``torch.cond``, a split) is ordered through the
    getitems that follow it. As a dependency of its own it had a user besides getitem, and
    the partitioner took it for a tensor."""
    return isinstance(node.meta["val"], (tuple, list))


def _unread_part(node: torch.fx.Node, visited: set[torch.fx.Node]) -> bool:
    """A getitem nothing reads, of a tuple whose getitem on the same stream and phase,
    already walked, is read: a sync is ordered after the tuple through that one. Depending
    on the unread one kept it alive after AOTAutograd had dropped the subgraph output it
    reads (two ``nested_compile_region`` calls under ``with stream:``: ``IndexError`` in the
    backward)."""
    if node.target is not operator.getitem or node.users:
        return False
    owner = node.args[0]
    return isinstance(owner, torch.fx.Node) and any(
        part in visited
        and part.users
        and stream_of(part) == stream_of(node)
        and is_backward(part) == is_backward(node)
        for part in owner.users
        if part is not node
    )


def _saved_not_recomputed(control: torch.fx.Node) -> None:
    """A passthrough re-exports a value for ordering only; torch copies its operand's
    meta onto it, activation-checkpoint tags included. Tagged "recompute", it could be
    neither recomputed (its ``control_deps`` is impure) nor saved, and the partitioner
    rejected every checkpointed function that synced or fed another stream."""
    for user in control.users:
        for key in AC_TAGS:
            user.meta.pop(key, None)


Lane = list[torch.fx.Node]  # a phase's compute nodes and syncs on one stream, in order


def _lanes(graph: torch.fx.Graph) -> dict[tuple[bool, object], Lane]:
    """For each (phase, annotated stream): its compute nodes, and the record/wait syncs
    that name it, in graph order."""
    ops = torch.ops.streams
    lanes: dict[tuple[bool, object], Lane] = {}
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if node.target in (ops.record_event.default, ops.wait_event.default):
            stream = node.args[1]
        elif is_sync_op(node.target):
            continue
        else:
            stream = stream_of(node)
        if stream is not None:
            lanes.setdefault((is_backward(node), stream), []).append(node)
    return lanes


def _read_after(sync: torch.fx.Node, lane: Lane, visited: set[torch.fx.Node]) -> list:
    """The values of ``sync``'s phase, made before it, that its stream reads up to the
    stream's next sync. A wait passes them through, so that work depends on the wait: a
    compiler cannot move it above the wait (the min-cut partitioner's reordering moved a
    side stream's first reads of an incoming gradient above the wait that orders them
    after the current stream). Work after the next sync depends on that one."""
    backward = is_backward(sync)
    values: dict[torch.fx.Node, None] = {}
    for node in lane[lane.index(sync) + 1 :] if sync in lane else ():
        if is_sync_op(node.target):
            break
        for value in node.all_input_nodes:
            if value in visited and _made_in_phase(value, backward):
                values[value] = None
    return list(values)


def _made_in_phase(value: torch.fx.Node, backward: bool) -> bool:
    """Made by the phase's own work. A value of the other phase (a saved forward value)
    exists before the phase starts, and passing it through a sync of this phase would pull
    it into the wrong graph; a forward input may be written back in place at the end, which
    must name the input itself. An incoming gradient (a tangent) is the backward's."""
    if value.op == "placeholder":
        return backward and is_tangent(value)
    return value.op == "call_function" and is_backward(value) == backward


def pin_syncs(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    """Tag every sync of the joint graph with its phase, to keep it in that phase's graph
    (a sync traced in a custom backward is already tagged backward: ``backward_phase``)."""
    notes = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and is_sync_op(node.target):
            before = node.meta.get(PARTITIONER_TAG)
            mark_phase(node, is_backward(node))
            if node.meta[PARTITIONER_TAG] != before:
                note = record(node, PIN_NAME, f"kept in the {node.meta[PARTITIONER_TAG]} graph")
                notes.append(f"{note.note} [{node.name}]")
    return notes


def wrap_syncs(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    from torch._functorch._aot_autograd.streams import _wrap_sync_node

    phases: dict[bool, Buckets] = {False: {}, True: {}}
    records: dict[int, torch.fx.Node] = {}
    visited: set[torch.fx.Node] = set()
    lanes = _lanes(gm.graph)
    waits: dict[tuple[bool, object], torch.fx.Node] = {}
    notes = []
    node = next(iter(gm.graph.nodes))
    while node.op != "root":
        following = node.next
        visited.add(node)
        if node.op == "call_function" and _orders_nothing_by_data(node):
            backward = is_backward(node)
            lane = lanes.get((backward, node.args[-1]), []) if node.args else []
            read_after = _read_after(node, lane, visited)
            if node.target is torch.ops.streams.wait_event.default:
                # an empty segment since the stream's last wait: keep the two in order
                previous = waits.get((backward, node.args[1]))
                read_after = [previous, *read_after] if previous is not None else read_after
            deps = _deps(node, phases[backward], records, read_after)
            recorded = node
            if deps:
                recorded = _wrap_sync_node(gm, node, deps, visited)[0]
                _keep_in_phase(recorded, backward)
                _saved_not_recomputed(recorded)
                note = record(recorded, NAME, f"{node.name} after {len(deps)} node(s)")
                notes.append(f"{note.note} [{recorded.name}]")
            if node.target is torch.ops.streams.wait_event.default:
                waits[(backward, node.args[1])] = recorded
            if node.target is torch.ops.streams.record_event.default:
                # A wait depends on its record, wrapped or not (a record with no earlier
                # work on its stream stays a plain node).
                records[node.args[0]] = recorded  # type: ignore[index]
        elif (
            node.op == "call_function"
            and "val" in node.meta
            and not _multi_output(node)
            and not _unread_part(node, visited)
        ):
            phases[is_backward(node)].setdefault(stream_of(node), []).append(node)
        node = following
    if notes:
        gm.recompile()
    return notes


PIN = GraphPass(
    PIN_NAME,
    pin_syncs,
    requires=frozenset({Fact.SYNCS_COMPLETE, Fact.PHASES_TAGGED}),
)
WRAP = GraphPass(
    NAME,
    wrap_syncs,
    requires=frozenset({Fact.SYNCS_COMPLETE}),
)
