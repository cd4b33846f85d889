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

from .. import api
from ..stream_ops import is_sync_op
from .annotations import (
    event_device,
    is_backward,
    mark_backward,
    record,
    stream_index,
    stream_of,
)

PASS_NAME = "backward_syncs"


def is_sync(node: torch.fx.Node) -> bool:
    return is_sync_op(node.target)


def _is_backward_value(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and is_backward(node) and not is_sync(node)


def _sync_node(
    graph: torch.fx.Graph, target: object, args: tuple[object, ...], note: str
) -> torch.fx.Node:
    node = graph.call_function(target, args)  # type: ignore[arg-type]
    mark_backward(node)
    record(node, PASS_NAME, note)
    return node


def _cross_stream_reads(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, torch.fx.Node]]:
    """(producer, first consumer on another stream) for each such pair, in graph order."""
    first: dict[tuple[torch.fx.Node, int | None], torch.fx.Node] = {}
    for consumer in graph.nodes:
        if consumer.op != "call_function" or not is_backward(consumer) or is_sync(consumer):
            continue
        for producer in consumer.all_input_nodes:
            if _is_backward_value(producer) and stream_of(producer) != stream_of(consumer):
                first.setdefault((producer, stream_of(consumer)), consumer)
    return [(producer, consumer) for (producer, _), consumer in first.items()]


def insert_backward_syncs(gm: torch.fx.GraphModule) -> bool:
    """Returns whether any sync was inserted."""
    graph = gm.graph
    events: dict[torch.fx.Node, int] = {}
    for producer, consumer in _cross_stream_reads(graph):
        device = event_device(producer, producer, consumer)
        if device is None:
            continue
        if producer not in events:
            event = events[producer] = api.new_event(device, phase="backward")
            with graph.inserting_after(producer):
                _sync_node(
                    graph,
                    torch.ops.streams.record_event.default,
                    (event, stream_index(producer)),
                    f"after {producer.name}, which {consumer.name} reads on another stream",
                )
        with graph.inserting_before(consumer):
            _sync_node(
                graph,
                torch.ops.streams.wait_event.default,
                (events[producer], stream_index(consumer)),
                f"{consumer.name} waits for {producer.name}",
            )
    return bool(events)
