"""A stable text form of joint/forward/backward graphs, for inline expectations.

Syncs wrapped in ``control_deps`` (torch >= 2.12) are shown as the sync itself and the
``getitem`` nodes that re-export values are folded back into those values, so the text is the
same on every torch version. Each node shows its stream and what our passes recorded on it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from torch_userstreams.fx.meta import records, stream_of


class _Named:
    """Renders as a given name (a backward input shown as the forward value it is)."""

    def __init__(self, name: str) -> None:
        self.name = name


def _inner_sync(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.fx.Node | None:
    if "control_deps" not in str(node.target):
        return None
    subgraph = getattr(gm, str(node.args[1].target))  # type: ignore[union-attr]
    return next(n for n in subgraph.graph.nodes if n.op == "call_function")


def _aliases(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, Any]:
    """getitem(control_deps, i) -> the value it passes through."""
    alias: dict[torch.fx.Node, Any] = {}
    for node in gm.graph.nodes:
        if node.target is operator.getitem and _inner_sync(gm, node.args[0]) is not None:
            passthrough = node.args[0].args[2:]
            alias[node] = passthrough[node.args[1] - 1]
    return alias


def _name(value: Any, alias: dict[torch.fx.Node, Any]) -> str:
    while isinstance(value, torch.fx.Node) and value in alias:
        value = alias[value]
    if isinstance(value, (torch.fx.Node, _Named)):
        return value.name
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_name(v, alias) for v in value) + "]"
    return repr(value)


def output_names(gm: torch.fx.GraphModule) -> list[str]:
    """The names of what a forward graph returns, control_deps passthroughs looked through."""
    alias = _aliases(gm)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    return [_name(value, alias) for value in values]


def _saved_names(gm: torch.fx.GraphModule, forward_outputs: list[str]) -> dict[str, str]:
    """Backward inputs named as the forward values they are: the partitioner names a saved
    value after the node that returned it, a control_deps passthrough on torch >= 2.12."""
    saved = [n for n in gm.graph.nodes if n.op == "placeholder" and "tangents" not in n.name]
    return dict(zip((n.name for n in saved), forward_outputs[-len(saved) :], strict=False))


def _target(target: Any) -> str:
    text = str(target)
    for prefix in ("torch.ops.", "aten."):
        text = text.removeprefix(prefix)
    return text.removesuffix(".default")


def render(gm: torch.fx.GraphModule, *, forward_outputs: list[str] | None = None) -> str:
    """One line per node. For a backward graph, ``forward_outputs`` (``output_names`` of its
    forward) names its saved inputs after the forward values they are."""
    alias = _aliases(gm)
    renamed = _saved_names(gm, forward_outputs) if forward_outputs else {}
    for node in gm.graph.nodes:
        if node.op == "placeholder" and node.name in renamed:
            alias[node] = _Named(renamed[node.name])
    lines = []
    for node in gm.graph.nodes:
        if (node in alias and node.op != "placeholder") or node.op == "get_attr":
            continue
        if node.op == "placeholder":
            lines.append(f"input {_name(node, alias)}")
            continue
        if node.op == "output":
            lines.append(f"return {_name(node.args[0], alias)}")
            continue
        shown = _inner_sync(gm, node) or node
        args = ", ".join(_name(a, alias) for a in shown.args)
        line = f"{_target(shown.target)}({args})"
        if "streams." not in line:  # a sync's node name depends on how torch wrapped it
            line = f"{node.name} = {line}"
        stream = stream_of(node)
        if stream is not None and shown is node and "streams." not in line:
            line += f"  @stream {stream}"
        notes = records(shown) or records(node)
        if notes:
            line += "  # " + "; ".join(r.pass_name for r in notes)
        lines.append(line)
    return "\n".join(lines)


def capture_aot(fn: Any, *args: Any) -> tuple[list[str], list[str], Any]:
    """Compile ``fn`` as ``userstreams_aot_eager`` does (the same AOTAutograd settings);
    return the rendered graphs."""
    from torch_userstreams.backends import aot_with_executor
    from torch_userstreams.backends.executor import compile_with_streams

    forward: list[str] = []
    backward: list[str] = []
    returned: list[str] = []

    def record_forward(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        forward.append(render(gm))
        returned[:] = output_names(gm)
        return compile_with_streams(gm, example_inputs)

    def record_backward(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        backward.append(render(gm, forward_outputs=returned))
        return compile_with_streams(gm, example_inputs)

    backend = aot_with_executor(record_forward, record_backward)
    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend)(*args)
    return forward, backward, out
