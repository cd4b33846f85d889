"""The subgraphs a graph calls, found one way.

A higher-order op (a ``torch.cond`` branch, a checkpointed body, a ``nested_compile_region``,
``flex_attention``'s ``mask_mod`` inside its block mask) reads the graph it calls through a
``get_attr`` node among its inputs, possibly inside a tuple or a keyword argument, with a
dotted target when the graph sits in a nested module. A ``control_deps`` node's subgraph
only holds its sync (``fx.control_deps`` reads it in place): it is not a graph the node
calls.

Two questions, two functions: which graphs run when ``gm`` runs, each judged on its own
(``reachable``), and which graphs a module holds at all, control_deps bodies included
(``held_by``: what compiled code may read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx

from .control_deps import is_control_deps


def attribute(gm: torch.nn.Module, node: torch.fx.Node, *, required: bool = False) -> Any:
    """What the ``get_attr`` node ``node`` reads from ``gm`` (its dotted target followed);
    where ``gm`` has no such attribute, None, or ``AttributeError`` if ``required`` (code
    that runs or copies the graph needs the value itself)."""
    value: Any = gm
    for part in str(node.target).split("."):
        value = getattr(value, part) if required else getattr(value, part, None)
    return value


def called_by(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[torch.fx.GraphModule]:
    """The graphs the call ``node`` of ``gm`` runs, in argument order, each once."""
    return [sub for _, sub in _calls(gm, node)]


def _calls(gm: torch.fx.GraphModule, node: torch.fx.Node) -> list[tuple[str, torch.fx.GraphModule]]:
    """(get_attr target, graph) for each graph ``node`` calls, each once."""
    if node.op != "call_function" or is_control_deps(node):
        return []
    found: list[tuple[str, torch.fx.GraphModule]] = []
    for used in node.all_input_nodes:
        sub = attribute(gm, used) if used.op == "get_attr" else None
        if isinstance(sub, torch.fx.GraphModule) and all(sub is not f for _, f in found):
            found.append((str(used.target), sub))
    return found


@dataclass(frozen=True)
class Subgraph:
    """A graph reached from the root: ``path`` holds the get_attr targets followed to it
    (empty for the root itself)."""

    path: tuple[str, ...]
    module: torch.fx.GraphModule

    def where(self) -> str:
        """A prefix naming the graph for a message: '' for the root."""
        return "".join(f"subgraph {target}: " for target in self.path)


def reachable(gm: torch.fx.GraphModule) -> list[Subgraph]:
    """``gm`` and every graph it calls, directly or through another, each once (a body
    several calls share is reached by its first), nearest first."""
    found = [Subgraph((), gm)]
    for graph in found:
        for node in graph.module.graph.nodes:
            for target, sub in _calls(graph.module, node):
                if all(sub is not f.module for f in found):
                    found.append(Subgraph((*graph.path, target), sub))
    return found


def held_by(module: torch.nn.Module) -> list[torch.fx.GraphModule]:
    """Every graph module inside ``module`` (itself included when it is one), called or not,
    control_deps bodies included."""
    return [m for m in module.modules() if isinstance(m, torch.fx.GraphModule)]
