"""Backward syncs: a value consumed on another stream than the one that produced it.

Rule: for each value a backward node produces and each *other* stream that consumes it in the
backward, the consumer stream waits for it. One event per producer, recorded right after the
producer on its stream; one wait per (producer, consumer stream), right before the first
consumer on that stream. Unlike native's pass, CPU values are handled too: on CPU the syncs
are logged no-ops, but the events they name are still materialized and resolved per call.

The compiled backward is one autograd node, and the engine runs it on the forward call's
current stream: it makes that stream wait for the incoming gradients, and takes the returned
gradients as made there. Eager runs each op's backward on its own forward stream, and the
engine syncs every edge. So, at the graph's edges:

* entry: each other stream that reads an incoming gradient (a tangent), or a forward value
  made on another stream that it did not read in the forward, waits for the current stream
  first (an event recorded on the
  current stream right before that stream's first such read): the forward's values are
  ready on the current stream when the backward starts (the forward joined its streams
  there), not on a side stream that never waited for them;
* exit: each returned gradient made on another stream is waited for by the current stream
  before the graph returns (an event recorded right after the node that made it).

Incoming gradients read on other streams are also freed safely: ``dealloc_syncs``.
"""

from __future__ import annotations

import functools

import torch
import torch.fx

from ..compile.contract import Fact, GraphPass
from ..compile.graph_compile import GraphCompile
from ..compile.table import Reader
from ..fx.meta import device_of, is_backward, is_tangent, stream_of
from ..fx.ops import is_sync_op, made_by
from ..fx.record_and_wait import insert_record, insert_record_and_wait, insert_wait
from .devices import event_device, new_event, stream_index

NAME = "backward_syncs"
# Every sync this pass adds belongs to the backward.
_record = functools.partial(insert_record, by=NAME, backward=True)
_wait = functools.partial(insert_wait, by=NAME, backward=True)


def _is_backward_value(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and is_backward(node) and not is_sync_op(node.target)


def _cross_stream_reads(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """(producer, first consumer on another stream) for each such pair, in graph order."""
    first: dict[tuple[torch.fx.Node, int | None], torch.fx.Node] = {}
    for consumer in graph.nodes:
        if consumer.op != "call_function" or not is_backward(consumer):
            continue
        if is_sync_op(consumer.target):
            continue
        for producer in consumer.all_input_nodes:
            if _is_backward_value(producer) and stream_of(producer) != stream_of(consumer):
                first.setdefault((producer, stream_of(consumer)), consumer)
    return [(producer, consumer) for (producer, _), consumer in first.items()]


def _edge_event(
    value: torch.fx.Node, stream: int, compile_: GraphCompile
) -> tuple[int, int] | None:
    """(a new event, the current stream) to order ``stream`` and the current stream over
    ``value``; None when no sync is needed: ``value`` is a CPU tensor under an accelerator
    stream (host order), or ``stream`` is the current stream."""
    device = compile_.table.device(stream)
    if device.type != device_of(value).type:
        return None
    current = compile_.current_stream(device, added_by=NAME, read_by=Reader.ADDED_NODES)
    if current == stream:
        return None
    return new_event(compile_, device, added_by=NAME, backward=True), current


def _made_before_the_backward(value: torch.fx.Node, stream: int) -> bool:
    """An incoming gradient, or a forward value made on another stream than ``stream`` and
    not read on ``stream`` in the forward: either is ready on the current stream when the
    backward starts, not on ``stream``. A forward read on ``stream`` already ordered it
    there (the user's sync, or a race the forward has anyway)."""
    if is_tangent(value):
        return True
    forward = value.op == "call_function" and not is_backward(value)
    if not forward or is_sync_op(value.target):
        return False
    made = made_by(value)
    if stream_of(made) == stream:
        return False
    readers = {*value.users, *made.users}
    return not any(not is_backward(reader) and stream_of(reader) == stream for reader in readers)


def _first_entry_reads(graph: torch.fx.Graph) -> dict[int, tuple[torch.fx.Node, torch.fx.Node]]:
    """For each annotated stream: (a value made before the backward, its first backward
    reader on that stream)."""
    first: dict[int, tuple[torch.fx.Node, torch.fx.Node]] = {}
    for node in graph.nodes:
        stream = stream_of(node)
        if not _is_backward_value(node) or stream is None or stream in first:
            continue
        value = next(
            (arg for arg in node.all_input_nodes if _made_before_the_backward(arg, stream)), None
        )
        if value is not None:
            first[stream] = (value, node)
    return first


def _entry_syncs(graph: torch.fx.Graph, compile_: GraphCompile) -> list[str]:
    notes = []
    for stream, (value, reader) in _first_entry_reads(graph).items():
        edge = _edge_event(value, stream, compile_)
        if edge is None:
            continue
        event, current = edge
        what = "the incoming gradient" if is_tangent(value) else "the forward's"
        notes += insert_record_and_wait(
            graph,
            reader,
            after=False,
            event=event,
            recorded_on=current,
            waiting=stream,
            by=NAME,
            backward=True,
            why=(
                f"{reader.name} reads {what} {value.name} on another stream",
                f"{reader.name} waits for what the backward was given",
            ),
        )
    return notes


def _returned_gradient_makers(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    """The backward nodes on an annotated stream that made a returned value, in order."""
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    makers = dict.fromkeys(made_by(value) for value in output.all_input_nodes)
    return [node for node in makers if _is_backward_value(node) and stream_of(node) is not None]


def _exit_syncs(graph: torch.fx.Graph, compile_: GraphCompile) -> list[str]:
    output = next(node for node in reversed(graph.nodes) if node.op == "output")
    notes = []
    for maker in _returned_gradient_makers(graph):
        stream = stream_of(maker)
        assert stream is not None
        edge = _edge_event(maker, stream, compile_)
        if edge is None:
            continue
        event, current = edge
        why = f"after {maker.name}, which makes a gradient the backward returns"
        notes.append(_record(graph, maker, after=True, event=event, stream=stream, why=why))
        why = f"the current stream waits for {maker.name} before the backward returns"
        notes.append(_wait(graph, output, after=False, event=event, stream=current, why=why))
    return notes


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    graph = gm.graph
    events: dict[torch.fx.Node, int] = {}
    notes = []
    for producer, consumer in _cross_stream_reads(graph):
        device = event_device(producer, producer, consumer, compile_)
        if device is None:
            continue
        if producer not in events:
            event = events[producer] = new_event(compile_, device, added_by=NAME, backward=True)
            why = f"after {producer.name}, which {consumer.name} reads on another stream"
            stream = stream_index(producer, compile_, NAME)
            notes.append(_record(graph, producer, after=True, event=event, stream=stream, why=why))
        why = f"{consumer.name} waits for {producer.name}"
        stream = stream_index(consumer, compile_, NAME)
        notes.append(
            _wait(graph, consumer, after=False, event=events[producer], stream=stream, why=why)
        )
    return notes + _entry_syncs(graph, compile_) + _exit_syncs(graph, compile_)


PASS = GraphPass(
    NAME,
    run,
    requires=frozenset({Fact.BACKWARD_STREAMS_INHERITED, Fact.ACCUMULATIONS_PLACED}),
    ensures=frozenset({Fact.BACKWARD_READS_SYNCED}),
    needs_compile=True,
)
