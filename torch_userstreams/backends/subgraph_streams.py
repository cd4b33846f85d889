"""Stream blocks inside a subgraph that stays a subgraph: refused on accelerator streams.

A ``torch.cond`` branch or a ``nested_compile_region`` body reaches the backends as a
subgraph that one node calls (checkpointed functions do not: AOTAutograd inlines them).
Both backends run that node as one unit on the node's own stream, so a ``with stream:``
block inside the body would run on the caller's stream instead. On CPU that is exact (every
stream runs in program order). On an accelerator it is a silent change of stream: an event
the user records on the block's stream no longer covers that work, and a consumer that waits
on it can read before the work is done. Such graphs are refused, naming the construct, the
stream and the line, and the way out: enter the stream around the call.

A body also carries the stream of the call Dynamo traced it under, and Dynamo reuses one
traced body for every call of a ``nested_compile_region``: an annotation that one of the
body's callers has is that inheritance, and is not refused (each call runs on its own
stream).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.fx

from ..compile.table import EntryKind, UserObjectTable, all_on_cpu
from ..errors import UnsupportedPathError
from ..fx.control_deps import is_control_deps
from ..fx.meta import stream_of
from ..fx.ops import is_sync_op

# What users wrote, for the higher-order ops that keep their subgraphs: (body, call).
_CONSTRUCTS = {
    "cond": ("torch.cond branch", "the torch.cond call"),
    "invoke_subgraph": (
        "torch.compiler.nested_compile_region body",
        "the call of the nested_compile_region function",
    ),
    "while_loop": ("torch.while_loop function", "the torch.while_loop call"),
}


def _annotated_inside(gm: torch.fx.GraphModule) -> Iterator[tuple[int, torch.fx.Node]]:
    """(stream, node) for the work inside ``gm`` (and the subgraphs it calls) that carries a
    stream annotation. A sync names its streams in its arguments: its annotation places no
    work."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and not is_sync_op(node.target):
            index = stream_of(node)
            if index is not None:
                yield index, node
        elif node.op == "get_attr":
            sub = getattr(gm, str(node.target), None)
            if isinstance(sub, torch.fx.GraphModule):
                yield from _annotated_inside(sub)


def _subgraphs_called(
    gm: torch.fx.GraphModule, node: torch.fx.Node
) -> Iterator[torch.fx.GraphModule]:
    if node.op != "call_function" or is_control_deps(node):
        return
    for used in node.all_input_nodes:
        sub = getattr(gm, str(used.target), None) if used.op == "get_attr" else None
        if isinstance(sub, torch.fx.GraphModule):
            yield sub


def _caller_streams(gm: torch.fx.GraphModule) -> dict[int, set[int | None]]:
    """For each subgraph (by identity), the streams of the nodes that call it. Dynamo traces
    a ``nested_compile_region`` body once and reuses it for every call, so the body carries
    the stream of the call it was traced under: an annotation some caller has is inherited,
    not a stream block inside the body (Dynamo cannot enter a stream it is already in)."""
    callers: dict[int, set[int | None]] = {}
    for node in gm.graph.nodes:
        for sub in _subgraphs_called(gm, node):
            callers.setdefault(id(sub), set()).add(stream_of(node))
    return callers


def _construct(node: torch.fx.Node) -> tuple[str, str]:
    name = getattr(node.target, "__name__", str(node.target))
    return _CONSTRUCTS.get(name, (f"{name} subgraph", f"the {name} call"))


def refuse_streams_in_subgraphs(
    gm: torch.fx.GraphModule, nodes: Iterable[torch.fx.Node], table: UserObjectTable | None
) -> None:
    """Raise if a subgraph that one of ``nodes`` calls has work in a stream block of its
    own: annotated with an accelerator stream that none of the subgraph's callers runs on."""
    if table is None or all_on_cpu(table):
        return
    callers = _caller_streams(gm)
    for node in nodes:
        for sub in _subgraphs_called(gm, node):
            allowed = callers[id(sub)]
            for index, inner in _annotated_inside(sub):
                if index in allowed or table.device(index).type == "cpu":
                    continue
                if None in allowed and table.entries[index].kind is EntryKind.CURRENT_STREAM:
                    continue  # the current stream, named: where an unannotated caller runs
                raise UnsupportedPathError(_refusal(table, node, inner, index))


def _refusal(table: UserObjectTable, node: torch.fx.Node, inner: torch.fx.Node, index: int) -> str:
    body, call = _construct(node)
    lines = [ln.strip() for ln in (inner.meta.get("stack_trace") or "").splitlines()]
    where = next((f" ({ln})" for ln in reversed(lines) if ln.startswith("File ")), "")
    return (
        f"torch_userstreams: graph {table.graph_name}: a `with stream:` block inside a {body} "
        f"puts work on stream {table.entries[index].origin} ({table.device(index)}){where}. "
        "Both backends run the construct as one unit on its caller's stream, where that work "
        "would leave its stream and the events recorded on it. Enter the stream around "
        f"{call} instead, or move the stream block out of the {body}."
    )
