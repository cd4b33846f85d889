"""Stream blocks inside a subgraph that stays a subgraph: refused on accelerator streams.

A ``torch.cond`` branch or a ``nested_compile_region`` body (or a ``scan``, ``map`` or
``while_loop`` function) stays a subgraph that one node calls, through AOTAutograd (a
checkpointed function does not: AOTAutograd inlines it).
Both backends run that node as one unit on the node's own stream, so a ``with stream:``
block inside the body would run on the caller's stream instead. On CPU that is exact (every
stream runs in program order). On an accelerator it is a silent change of stream: an event
the user records on the block's stream no longer covers that work, and a consumer that waits
on it can read before the work is done. Such graphs are refused, naming the construct, the
stream and the line, and the way out: enter the stream around the call.

The check reads Dynamo's graph, where a body's annotations are as traced. Dynamo traces a
body under the stream of the call that first reaches it (in program order, which a walk of
the graph and its subgraphs in node order follows) and reuses it for every later call of
a ``nested_compile_region``: work annotated with that stream is the body's own, which runs
on each caller's stream as in eager; any other annotation is a stream block in the body.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.fx

from ..compile.table import EntryKind, UserObjectTable, all_on_cpu
from ..errors import UnsupportedPathError
from ..fx.meta import stream_of
from ..fx.ops import is_sync_op
from ..fx.subgraphs import called_by

# What users wrote, for the constructs whose subgraphs stay subgraphs: (body, call). Any
# other higher-order op with a subgraph is treated the same (``construct_names``).
_CONSTRUCTS = {
    "cond": ("torch.cond branch", "the torch.cond call"),
    "invoke_subgraph": (
        "torch.compiler.nested_compile_region body",
        "the call of the nested_compile_region function",
    ),
    "while_loop": ("torch.while_loop function", "the torch.while_loop call"),
    "scan": ("scan combine function", "the scan call"),
    "map_impl": ("torch.map function", "the map call"),
}
# Higher-order ops whose subgraphs AOTAutograd inlines into the graph that calls them: their
# nodes run on their own annotations, so a stream block there is fine. Every other op that
# calls a subgraph is taken to keep it (a wrong guess refuses loudly, never runs silently).
_INLINED = frozenset(
    {
        "tag_activation_checkpoint",
        "wrap_activation_checkpoint",
        "wrap",
        "wrap_with_set_grad_enabled",
        "wrap_with_autocast",
        "autograd_function_apply",
    }
)
_WORK = ("call_function", "call_method", "call_module")


def _annotated_inside(gm: torch.fx.GraphModule) -> Iterator[tuple[int | None, torch.fx.Node]]:
    """(stream, node) for the work inside ``gm`` and the subgraphs AOTAutograd inlines into
    it (a checkpointed function's); a construct's own subgraph is checked on its own. A
    sync names its streams in its arguments: its annotation places no work. In Dynamo's
    graph a tensor method (``x.sin()``) is a ``call_method`` node."""
    for node in gm.graph.nodes:
        if node.op in _WORK and not is_sync_op(node.target):
            yield stream_of(node), node
        if _op_name(node) in _INLINED:
            for sub in called_by(gm, node):
                yield from _annotated_inside(sub)


def _kept_calls(
    gm: torch.fx.GraphModule, walked: set[int] | None = None
) -> Iterator[tuple[torch.fx.Node, torch.fx.GraphModule]]:
    """(calling node, subgraph) for each subgraph call of a construct that keeps it, in
    ``gm`` and every subgraph, in the order Dynamo traced them. A body reused by several
    calls is walked into once."""
    walked = set() if walked is None else walked
    for node in gm.graph.nodes:
        for sub in called_by(gm, node):
            if _op_name(node) not in _INLINED:
                yield node, sub
            if id(sub) not in walked:
                walked.add(id(sub))
                yield from _kept_calls(sub, walked)


def _op_name(node: torch.fx.Node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def construct_names(node: torch.fx.Node) -> tuple[str, str]:
    """What the user wrote for the higher-order op ``node`` calls: (its body, its call), for
    errors that name the construct rather than torch's op."""
    name = _op_name(node)
    return _CONSTRUCTS.get(name, (f"{name} subgraph", f"the {name} call"))


def refuse_streams_in_subgraphs(gm: torch.fx.GraphModule, table: UserObjectTable) -> None:
    """Raise if the body of a construct that stays a subgraph has a stream block of its
    own on an accelerator stream. ``gm`` is Dynamo's graph."""
    if all_on_cpu(table):
        return
    checked: set[int] = set()
    for node, sub in _kept_calls(gm):
        if id(sub) in checked:
            continue  # a later call of a reused body: traced under the first one's stream
        checked.add(id(sub))
        traced_under = stream_of(node)
        for index, inner in _annotated_inside(sub):
            if index is None or index == traced_under or table.device(index).type == "cpu":
                continue
            if traced_under is None and table.entries[index].kind is EntryKind.CURRENT_STREAM:
                continue  # the current stream, named: where the body runs anyway
            raise UnsupportedPathError(_refusal(table, node, inner, index))


def _refusal(table: UserObjectTable, node: torch.fx.Node, inner: torch.fx.Node, index: int) -> str:
    body, call = construct_names(node)
    lines = [ln.strip() for ln in (inner.meta.get("stack_trace") or "").splitlines()]
    where = next((f" ({ln})" for ln in reversed(lines) if ln.startswith("File ")), "")
    return (
        f"torch_userstreams: graph {table.graph_name}: a `with stream:` block inside a {body} "
        f"puts work on stream {table.entries[index].origin} ({table.device(index)}){where}. "
        "Both backends run the construct as one unit on its caller's stream, where that work "
        "would leave its stream and the events recorded on it. Enter the stream around "
        f"{call} instead, or move the stream block out of the {body}."
    )
