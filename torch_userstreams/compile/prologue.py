"""Generate a graph's prologue: bytecode that binds one call's user objects.

Emitted once per graph, *after* the backend returned, so objects the backend requested
while compiling are in it. Shape::

    __userstreams_thread.calls.pending = (__userstreams_graph, <object 0>, <object 1>, ...)

where ``__userstreams_graph`` is the graph's ``BoundGraph`` and ``__userstreams_thread`` the
run-time layer's thread-local state (``run.state``). The tuple is the call's binding; no
Python frame runs but the factories of graph-created objects, and the graph call right
after takes the binding from ``pending``. A graph whose table is empty gets no prologue at all.
"""

from __future__ import annotations

import re
from typing import Any

from ..fx.meta import stream_of
from ..fx.ops import is_lookup, is_sync_op, table_indices
from ..fx.subgraphs import held_by
from ..run.bound_graph import BoundGraph
from ..run.state import state
from . import emitters
from .table import UserObjectTable

GRAPH_GLOBAL = "__userstreams_graph"
THREAD_GLOBAL = "__userstreams_thread"


def _int_args(node: Any) -> list[int]:
    return [a for a in (*node.args, *node.kwargs.values()) if type(a) is int]


def referenced_indices(graph: Any) -> set[int]:
    """Table indices an FX graph reads: lookup nodes, sync ops, stream annotations."""
    used: set[int] = set()
    for node in graph.nodes:
        stream = stream_of(node)
        if stream is not None:
            used.add(stream)
        if node.op == "call_function" and is_lookup(node.target):
            used.update(_int_args(node))
        elif node.op == "call_function" and is_sync_op(node.target):
            used.update(table_indices(node))
    return used


def subgraph_modules(output_graph: Any) -> list[Any]:
    """The subgraphs the frame's higher-order ops call (a checkpointed function's body, a
    ``torch.cond`` branch), nested ones included: they read the table too."""
    import torch.fx

    found = []
    for module in dict(getattr(output_graph, "nn_modules", {})).values():
        if isinstance(module, torch.fx.GraphModule):
            found += held_by(module)
    return found


def graphs_of(output_graph: Any) -> list[Any]:
    """The frame's FX graph and its subgraphs' (``subgraph_modules``)."""
    return [output_graph.graph, *(m.graph for m in subgraph_modules(output_graph))]


def read_by(graphs: list[Any]) -> set[int]:
    """Every table index ``graphs`` read (``referenced_indices`` of each)."""
    return set().union(*(referenced_indices(graph) for graph in graphs))


def build(output_graph: Any, table: UserObjectTable, bound: BoundGraph) -> list[Any]:
    """The prologue instructions for ``table``, leaving the call's binding for ``bound``."""
    from torch._dynamo.bytecode_transformation import create_instruction
    from torch._dynamo.codegen import PyCodegen

    cg = PyCodegen(output_graph.root_tx)

    def load_global(name: str, value: Any) -> None:
        cg.append_output(cg.create_load_global(output_graph.install_global(name, value), add=True))

    load_global(GRAPH_GLOBAL, bound)
    for entry in table.entries:
        (entry.emit if table.loads(entry.index) else emitters.placeholder)(cg)
    cg.append_output(create_instruction("BUILD_TUPLE", arg=len(table.entries) + 1))
    load_global(THREAD_GLOBAL, state)
    cg.append_output(cg.create_load_attr("calls"))
    cg.append_output(cg.create_store_attr("pending"))
    return list(cg.get_instructions())


_GENERATED_NAME = re.compile(r"^(__\w+?)(_\d+)+(_c\d+)?$")


def _normalize(argval: Any, arg: Any) -> str:
    if type(argval).__name__ == "type" and argval.__name__ == "_NotProvided":
        return "" if arg is None else str(arg)
    if isinstance(argval, str):
        match = _GENERATED_NAME.match(argval)
        return match.group(1) if match else argval
    if argval is None:
        return ""
    return repr(argval)


def render(instructions: list[Any]) -> str:
    """A dis-like listing, without offsets, addresses or generated-name suffixes; constants
    as Python writes them."""
    lines = []
    for inst in instructions:
        constant = inst.opname == "LOAD_CONST" and inst.argval is not None
        # A constant as Python writes it ('cuda', not cuda): prologue_text reads it back.
        arg = repr(inst.argval) if constant else _normalize(inst.argval, inst.arg)
        lines.append(f"{inst.opname} {arg}".rstrip())
    return "\n".join(lines)
