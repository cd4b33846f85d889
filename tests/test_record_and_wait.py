"""``fx.record_and_wait``: the one place passes insert a record and a wait."""

from __future__ import annotations

import torch
import torch.fx

from torch_userstreams.fx.meta import is_backward, records
from torch_userstreams.fx.ops import SyncOperands, operands
from torch_userstreams.fx.record_and_wait import (
    insert_record,
    insert_record_and_wait,
    insert_wait,
)


def _graph() -> tuple[torch.fx.Graph, torch.fx.Node, torch.fx.Node]:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.sin, (x,))
    z = graph.call_function(torch.cos, (y,))
    graph.output(z)
    return graph, y, z


def _ops(graph: torch.fx.Graph) -> list[str]:
    return [n.target.__name__ if n.op == "call_function" else str(n.target) for n in graph.nodes]


def test_a_pair_after_a_node_records_then_waits_holding_the_tensor() -> None:
    graph, y, _ = _graph()
    notes = insert_record_and_wait(
        graph, y, after=True, event=5, recorded_on=1, waiting=2, holds=y,
        by="demo", why=("recorded", "waited"), backward=True,
    )  # fmt: skip
    assert _ops(graph) == [
        "x",
        "sin",
        "record_event.default",
        "sync_dealloc.default",
        "cos",
        "output",
    ]
    recorded, waited = list(graph.nodes)[2:4]
    assert operands("record_event", recorded.args) == SyncOperands(event=5, stream=1)
    assert operands("sync_dealloc", waited.args) == SyncOperands(event=5, stream=2, tensor=y)
    assert notes == [f"recorded [{recorded.name}]", f"waited [{waited.name}]"]
    assert [str(r) for r in records(waited)] == ["demo: waited"]
    assert is_backward(recorded) and is_backward(waited)


def test_a_pair_before_a_node_and_a_record_and_wait_apart() -> None:
    graph, y, z = _graph()
    insert_record_and_wait(
        graph, z, after=False, event=3, recorded_on=0, waiting=1, by="p", why=("a", "b")
    )
    assert _ops(graph) == [
        "x",
        "sin",
        "record_event.default",
        "wait_event.default",
        "cos",
        "output",
    ]
    graph, y, z = _graph()
    insert_record(graph, y, after=True, event=4, stream=1, by="p", why="r")
    insert_wait(graph, z, after=True, event=4, stream=0, by="p", why="w")
    assert _ops(graph) == [
        "x",
        "sin",
        "record_event.default",
        "cos",
        "wait_event.default",
        "output",
    ]
    assert not any(is_backward(n) for n in graph.nodes)  # no phase asked, none set
