"""Typed access to the node metadata the stream passes read and write.

Stream assignment lives where Dynamo puts it (``node.meta["custom"]["stream"]``, an index
into the graph's user-object table). What our passes add is recorded under one key,
``node.meta["torch_userstreams"]``, as ``PassRecord`` objects, so ``explain()`` and tests can
tell which pass added each sync and why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

from .. import api
from ..errors import UnsupportedPathError, UserObjectError
from ..registration import compiling_table, table_if_compiling
from ..table import UserObjectTable

RECORDS_KEY = "torch_userstreams"
_BACKWARD_TAGS = ("is_backward", "must_be_in_backward")


@dataclass(frozen=True)
class PassRecord:
    """One change a pass made to a node (or the node it created)."""

    pass_name: str
    note: str

    def __str__(self) -> str:
        return f"{self.pass_name}: {self.note}"


def stream_of(node: torch.fx.Node) -> int | None:
    """The table index of the stream ``node`` runs on, or None for the current stream."""
    custom = node.meta.get("custom")
    if isinstance(custom, dict):
        index = custom.get("stream")
        return index if isinstance(index, int) else None
    return None


def check_streams(graph: torch.fx.Graph, table: UserObjectTable) -> None:
    """Every stream annotation of ``graph`` names a stream of its own ``table``.

    An annotation that does not (an index of another graph, left by a failed trace) would
    run the node on some other call's object, or fail deep inside a backend.
    """
    for node in graph.nodes:
        index = stream_of(node)
        if index is None:
            continue
        known = 0 <= index < len(table)
        if not known or not isinstance(table.entries[index].example, torch.Stream):
            what = table.entries[index].describe().strip() if known else "nothing"
            raise UserObjectError(
                f"torch_userstreams: node {node.name} of graph {table.graph_name} is "
                f"annotated to run on stream {index}, but entry {index} of its table is "
                f"{what}. A stream annotation from another trace leaked into this one; "
                "call torch._dynamo.reset() and compile again, and report it if it recurs."
            )


def set_stream(node: torch.fx.Node, index: int) -> None:
    custom = node.meta.get("custom")
    if not isinstance(custom, dict):
        custom = node.meta["custom"] = {}
    custom["stream"] = index


def stream_index(node: torch.fx.Node) -> int:
    """The stream ``node`` runs on as a table index; the device's current stream if unset."""
    index = stream_of(node)
    if index is not None:
        return index
    return api.current_stream(device_of(node))


def device_of(node: torch.fx.Node) -> torch.device:
    """The device a node's work runs on: an accelerator if any tensor it touches lives there.

    A copy between CPU and an accelerator is issued on the accelerator's stream, whichever
    side its output is on; CPU-only work runs on the host, in program order.
    """
    touched = (node, *node.all_input_nodes)
    devices = [t.device for n in touched for t in _tensors(n.meta.get("val"))]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))


def _tensors(value: object) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


def stream_device(node: torch.fx.Node) -> torch.device:
    """The device of the stream ``node`` runs on: its annotated stream's, else its own."""
    index = stream_of(node)
    return device_of(node) if index is None else compiling_table("a stream pass").device(index)


def event_device(
    value: torch.fx.Node, recorder: torch.fx.Node, waiter: torch.fx.Node
) -> torch.device | None:
    """The device of an event that makes ``waiter``'s stream wait for ``recorder``'s work on
    ``value``: the recording stream's. None when no sync is needed: work on a CPU tensor
    runs on the host in program order, whatever stream context it was issued in.

    Raises when an accelerator's work would have to wait on a CPU stream (or the reverse):
    no event can express that.
    """
    recorded_on, waited_on = stream_device(recorder), stream_device(waiter)
    if recorded_on.type == waited_on.type:
        return recorded_on
    device = device_of(value)
    if device.type == "cpu":
        return None
    graph = compiling_table("a stream pass").graph_name
    raise UnsupportedPathError(
        f"torch_userstreams: graph {graph} uses the {device} tensor {value.name} on a "
        f"{recorded_on} stream ({recorder.name}) and on a {waited_on} stream ({waiter.name}); "
        "an event of one device cannot order the other's stream. Issue work on "
        f"{device} tensors inside {device.type} streams only (torch.Stream(device="
        f"{str(device)!r}))."
    )


def is_backward(node: torch.fx.Node) -> bool:
    return node.meta.get("partitioner_tag") in _BACKWARD_TAGS


def is_gradient_accumulation(node: torch.fx.Node) -> bool:
    return bool(node.meta.get("is_gradient_acc", False))


def mark_backward(node: torch.fx.Node) -> None:
    """Nodes a backward pass inserts must stay in the backward graph when partitioned."""
    node.meta["partitioner_tag"] = "must_be_in_backward"


def mark_forward(node: torch.fx.Node) -> None:
    """Forward syncs must stay in the forward graph when partitioned: a sync names only
    table indices, so without the tag the partitioner copies it into the backward graph
    too (and saves its ``control_deps`` wrapper there, which holds no tensor)."""
    node.meta["partitioner_tag"] = "must_be_in_forward"


def mark_phase(node: torch.fx.Node, backward: bool) -> None:
    (mark_backward if backward else mark_forward)(node)


def record(node: torch.fx.Node, pass_name: str, note: str) -> None:
    """Remember on the node (and in the graph's table, for ``explain()``) what a pass did."""
    entry = PassRecord(pass_name, note)
    node.meta.setdefault(RECORDS_KEY, []).append(entry)
    table = table_if_compiling()
    if table is not None:
        table.pass_notes.append(f"{entry} [{node.name}]")


def records(node: torch.fx.Node) -> list[PassRecord]:
    return list(node.meta.get(RECORDS_KEY, ()))
