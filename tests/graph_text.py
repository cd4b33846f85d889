"""A stable text form of joint/forward/backward graphs, for inline expectations.

Syncs wrapped in ``control_deps`` (torch >= 2.13) are shown as the sync itself and the
``getitem`` nodes that re-export values are folded back into those values, so the text is the
same on every torch version. Each node shows its stream and what our passes recorded on it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from torch_userstreams.passes.annotations import records, stream_of


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
    if isinstance(value, torch.fx.Node):
        return value.name
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_name(v, alias) for v in value) + "]"
    return repr(value)


def _replayed_forward(node: torch.fx.Node) -> bool:
    return node.meta.get("partitioner_tag") == "is_forward"


def _target(target: Any) -> str:
    text = str(target)
    for prefix in ("torch.ops.", "aten."):
        text = text.removeprefix(prefix)
    return text.removesuffix(".default")


def render(gm: torch.fx.GraphModule, *, backward: bool = False) -> str:
    """One line per node. In a backward graph, forward nodes the partitioner replays there
    (torch 2.13 replays a user's forward sync next to a value it saves; 2.15 does not) are
    left out, so the expectation holds on every version."""
    alias = _aliases(gm)
    lines = []
    for node in gm.graph.nodes:
        if node in alias or node.op == "get_attr":
            continue
        if backward and node.op == "call_function" and _replayed_forward(node):
            continue
        if node.op == "placeholder":
            lines.append(f"input {node.name}")
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
    """Compile ``fn`` with the package's aot_eager-style backend; return rendered graphs."""
    from torch._dynamo.backends.common import aot_autograd

    from torch_userstreams.stream_executor import compile_with_streams

    forward: list[str] = []
    backward: list[str] = []

    def recording(into: list[str]) -> Any:
        def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            into.append(render(gm, backward=into is backward))
            return compile_with_streams(gm, example_inputs)

        return compiler

    backend = aot_autograd(fw_compiler=recording(forward), bw_compiler=recording(backward))
    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend)(*args)
    return forward, backward, out
