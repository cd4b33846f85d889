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
from ..registration import table_if_compiling

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
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        return value.device
    return torch.device("cpu")


def is_backward(node: torch.fx.Node) -> bool:
    return node.meta.get("partitioner_tag") in _BACKWARD_TAGS


def is_gradient_accumulation(node: torch.fx.Node) -> bool:
    return bool(node.meta.get("is_gradient_acc", False))


def mark_backward(node: torch.fx.Node) -> None:
    """Nodes a backward pass inserts must stay in the backward graph when partitioned."""
    node.meta["partitioner_tag"] = "must_be_in_backward"


def record(node: torch.fx.Node, pass_name: str, note: str) -> None:
    """Remember on the node (and in the graph's table, for ``explain()``) what a pass did."""
    entry = PassRecord(pass_name, note)
    node.meta.setdefault(RECORDS_KEY, []).append(entry)
    table = table_if_compiling()
    if table is not None:
        table.pass_notes.append(f"{entry} [{node.name}]")


def records(node: torch.fx.Node) -> list[PassRecord]:
    return list(node.meta.get(RECORDS_KEY, ()))
