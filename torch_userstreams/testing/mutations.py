"""Graph surgery for negative tests: find the syncs of a graph and delete one of them.

Deleting a sync must leave a valid graph that computes the same values, so that the only
difference the checker can see is the missing ordering: a ``control_deps`` node's
re-exported values (``getitem(control_deps, i)``, i >= 1) are replaced by the values it
passed through, and other ``control_deps`` nodes that listed it as a dependency drop it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch.fx

from ..fx.control_deps import is_control_deps
from .graph_view import Sync, read_graph


def syncs(gm: torch.fx.GraphModule, op: Any = None) -> list[Sync]:
    """The syncs of ``gm`` in issue order (``control_deps`` looked through), maybe one op's."""
    found = [step for step in read_graph(gm).steps if isinstance(step, Sync)]
    return [sync for sync in found if op is None or sync.op is op]


def _drop_dependency(user: torch.fx.Node, dep: torch.fx.Node) -> None:
    if is_control_deps(user) and dep in user.args[0]:  # type: ignore[operator]
        deps = tuple(d for d in user.args[0] if d is not dep)  # type: ignore[union-attr]
        user.args = (deps, *user.args[1:])
        return
    raise ValueError(f"cannot delete sync {dep.name}: {user.name} uses its result")


def delete_sync(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    """Remove the sync issued by ``node`` (a sync op or a ``control_deps``), then lint."""
    graph = gm.graph
    subgraph = None
    if is_control_deps(node):
        subgraph = node.args[1]
        passthrough = node.args[2:]
        for user in list(node.users):
            if user.target is operator.getitem and user.args[0] is node:
                index = user.args[1]
                if isinstance(index, int) and index >= 1:
                    user.replace_all_uses_with(passthrough[index - 1])  # type: ignore[arg-type]
                    graph.erase_node(user)
    for user in list(node.users):
        _drop_dependency(user, node)
    graph.erase_node(node)
    if isinstance(subgraph, torch.fx.Node) and not subgraph.users:
        graph.erase_node(subgraph)
    graph.lint()
    gm.recompile()
