"""Syncs wrapped in ``control_deps``, read as the sync they issue.

torch >= 2.12 wraps a sync node in ``control_deps(deps, subgraph, *operands)``: the subgraph
holds the sync op, ``deps`` only orders it, and ``getitem(control_deps, i)`` for i >= 1
passes ``operands[i - 1]`` through unchanged. ``sync_of`` gives the sync a node issues (a plain
sync op or such a wrapper); ``alias_of`` gives the value a passthrough stands for.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch.fx

from .ops import is_sync_op, sync_args

CONTROL_DEPS = "control_deps"


@dataclass(eq=False)
class SyncCall:
    """One sync op as issued: ``node`` is the op itself or the control_deps wrapping it
    (None for a sync read from Inductor's generated code, ``inductor.sync_lines``)."""

    node: torch.fx.Node | None
    op: Any
    args: tuple[Any, ...]  # the outer graph's nodes and constants


def is_control_deps(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and getattr(node.target, "_name", None) == CONTROL_DEPS


def alias_of(node: Any) -> Any:
    """The value ``node`` stands for: a passthrough is its operand; None for the sync's own
    (empty) result; anything else is itself."""
    while (
        isinstance(node, torch.fx.Node)
        and node.target is operator.getitem
        and isinstance(node.args[0], torch.fx.Node)
        and is_control_deps(node.args[0])
    ):
        index = node.args[1]
        if not isinstance(index, int) or index == 0:
            return None
        node = node.args[0].args[1 + index]
    return node


def is_passthrough(node: torch.fx.Node) -> bool:
    return alias_of(node) is not node


def sync_node(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.fx.Node | None:
    """The sync op node ``node`` issues: itself, or the one inside its ``control_deps``
    subgraph (whose metadata keeps the user's stack trace); None when it issues none."""
    if node.op != "call_function":
        return None
    if is_sync_op(node.target):
        return node
    if not is_control_deps(node):
        return None
    subgraph = getattr(gm, str(node.args[1].target))  # type: ignore[union-attr]
    for sub in subgraph.graph.nodes:
        if sub.op == "call_function" and is_sync_op(sub.target):
            return sub  # type: ignore[no-any-return]
    raise ValueError(f"control_deps node {node.name} wraps no sync op")


def sync_of(gm: torch.fx.GraphModule, node: torch.fx.Node) -> SyncCall | None:
    """The sync ``node`` issues, or None when it issues none."""
    sync = sync_node(gm, node)
    if sync is None:
        return None
    if sync is node:
        return SyncCall(node, node.target, sync_args(node))
    placeholders = [n for n in sync.graph.nodes if n.op == "placeholder"]
    inner: dict[torch.fx.Node, Any] = dict(zip(placeholders, node.args[2:], strict=False))
    return SyncCall(node, sync.target, tuple(torch.fx.map_arg(sync_args(sync), inner.get)))
