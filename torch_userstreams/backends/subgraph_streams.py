"""Stream blocks inside a subgraph that stays a subgraph: refused on accelerator streams.

A ``torch.cond`` branch or a ``nested_compile_region`` body reaches the backends as a
subgraph that one node calls (checkpointed functions do not: AOTAutograd inlines them).
Both backends run that node as one unit on the node's own stream, so a ``with stream:``
block inside the body would run on the caller's stream instead. On CPU that is exact (every
stream runs in program order). On an accelerator it is a silent change of stream: an event
the user records on the block's stream no longer covers that work, and a consumer that waits
on it can read before the work is done. Dynamo also reuses one traced body for calls of a
``nested_compile_region`` that pass different streams (torch 2.11), so the body's own
annotation can name the wrong stream. Such graphs are refused, naming the construct and the
way out: enter the stream around the call.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.fx

from ..compile.table import UserObjectTable
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
    "while_loop": ("torch.while_loop body", "the torch.while_loop call"),
}


def _streams_inside(gm: torch.fx.GraphModule) -> Iterator[int]:
    """The streams that work inside ``gm`` (and the subgraphs it calls) is annotated with.
    A sync names its streams in its arguments: its annotation places no work."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and not is_sync_op(node.target):
            index = stream_of(node)
            if index is not None:
                yield index
        elif node.op == "get_attr":
            sub = getattr(gm, str(node.target), None)
            if isinstance(sub, torch.fx.GraphModule):
                yield from _streams_inside(sub)


def _construct(node: torch.fx.Node) -> tuple[str, str]:
    name = getattr(node.target, "__name__", str(node.target))
    return _CONSTRUCTS.get(name, (f"{name} subgraph", f"the {name} call"))


def refuse_streams_in_subgraphs(
    gm: torch.fx.GraphModule, nodes: Iterable[torch.fx.Node], table: UserObjectTable | None
) -> None:
    """Raise if a subgraph that one of ``nodes`` calls has work annotated with an
    accelerator stream other than the calling node's own."""
    if table is None:
        return
    for node in nodes:
        if node.op != "call_function" or is_control_deps(node):
            continue
        own = stream_of(node)
        for used in node.all_input_nodes:
            sub = getattr(gm, str(used.target), None) if used.op == "get_attr" else None
            if not isinstance(sub, torch.fx.GraphModule):
                continue
            for index in _streams_inside(sub):
                if index != own and table.device(index).type != "cpu":
                    raise UnsupportedPathError(_refusal(table, node, index, own))


def _refusal(table: UserObjectTable, node: torch.fx.Node, index: int, own: int | None) -> str:
    body, call = _construct(node)
    caller = "the current stream" if own is None else f"stream [{own}]"
    return (
        f"torch_userstreams: graph {table.graph_name}: work inside a {body} ({node.name}) "
        f"is in a `with stream:` block on stream [{index}] ({table.device(index)}), but the "
        f"backends run the construct as one unit on its caller's stream ({caller}). There "
        "the work would not be covered by the events recorded on its own stream. Enter the "
        f"stream around {call} instead, or move the stream block out of the {body}."
    )
