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
    """One sync op as issued: ``node`` is the op itself or the control_deps wrapping it."""

    node: torch.fx.Node
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


def erase_sync(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    """Take the sync ``node`` issues out of ``gm``: a plain sync op is erased; so is a
    ``control_deps`` wrapper, each of its passthroughs replaced by the value it passes, and
    where another wrapper orders itself after it, the wrapper's own dependencies take its
    place (what was ordered before it stays ordered before that one)."""
    graph = gm.graph
    if not is_control_deps(node):
        if sync_node(gm, node) is not node:
            raise ValueError(f"{node.name} issues no sync")
        _take_out_of_deps(node, ())
        graph.erase_node(node)
        return
    for user in list(node.users):
        if user.target is operator.getitem and user.args[0] is node:
            index = user.args[1]
            if isinstance(index, int) and index >= 1:
                user.replace_all_uses_with(node.args[1 + index])  # type: ignore[arg-type]
            _take_out_of_deps(user, node.args[0])  # type: ignore[arg-type]
            graph.erase_node(user)
    _take_out_of_deps(node, node.args[0])  # type: ignore[arg-type]
    subgraph = node.args[1]
    graph.erase_node(node)
    if isinstance(subgraph, torch.fx.Node) and not subgraph.users:
        graph.erase_node(subgraph)
        if not any(n.op == "get_attr" and n.target == subgraph.target for n in graph.nodes):
            delattr(gm, str(subgraph.target))


def _take_out_of_deps(dep: torch.fx.Node, instead: tuple[torch.fx.Node, ...]) -> None:
    """Replace ``dep`` by ``instead`` in the dependencies of every wrapper that names it;
    ``dep`` must then be read by nothing else."""
    for user in list(dep.users):
        if not is_control_deps(user) or dep not in user.args[0]:  # type: ignore[operator]
            raise ValueError(f"{user.name} reads {dep.name}, which issues a sync being erased")
        deps: list[torch.fx.Node] = []
        for each in user.args[0]:  # type: ignore[union-attr]
            for new in instead if each is dep else (each,):
                if new not in deps:
                    deps.append(new)  # type: ignore[arg-type]
        user.args = (tuple(deps), *user.args[1:])
