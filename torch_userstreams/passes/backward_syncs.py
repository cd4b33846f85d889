"""Backward syncs: a value consumed on another stream than the one that produced it.

Rule: for each value a backward node produces and each *other* stream that consumes it in the
backward, the consumer stream waits for it. One event per producer, recorded right after the
producer on its stream; one wait per (producer, consumer stream), right before the first
consumer on that stream. Incoming gradients are not synced here: the autograd engine already
makes the backward wait for the stream that produced them. Unlike native's pass, CPU values
are handled too: on CPU the syncs are logged no-ops, but the events they name are still
materialized and resolved per call.
"""

from __future__ import annotations

import torch
import torch.fx

from ..compile.graph_compile import GraphCompile
from ..fx.meta import is_backward, mark_phase, record, stream_of
from ..fx.ops import is_sync_op
from .contract import GraphPass
from .devices import event_device, new_event, stream_index

NAME = "backward_syncs"


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


def _sync(graph: torch.fx.Graph, target: object, args: tuple[object, ...], note: str) -> str:
    node = graph.call_function(target, args)  # type: ignore[arg-type]
    mark_phase(node, backward=True)
    return f"{record(node, NAME, note).note} [{node.name}]"


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
            with graph.inserting_after(producer):
                notes.append(
                    _sync(
                        graph,
                        torch.ops.streams.record_event.default,
                        (event, stream_index(producer, compile_, NAME)),
                        f"after {producer.name}, which {consumer.name} reads on another stream",
                    )
                )
        with graph.inserting_before(consumer):
            notes.append(
                _sync(
                    graph,
                    torch.ops.streams.wait_event.default,
                    (events[producer], stream_index(consumer, compile_, NAME)),
                    f"{consumer.name} waits for {producer.name}",
                )
            )
    return notes


PASS = GraphPass(
    NAME,
    run,
    requires=frozenset({"backward streams inherited", "accumulations placed"}),
    ensures=frozenset({"backward reads synced"}),
    needs_compile=True,
)
