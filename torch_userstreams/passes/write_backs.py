"""An input's in-graph write-back runs where the function updated the input.

AOTAutograd keeps an update of a graph input (a buffer's running statistics, an EMA, a
gradient scaled in a hook) in the graph as a ``copy_`` into the input at the very end, on
the stream that computed the new value. A join the function wrote after the update
(``main.wait_stream(side)``, ``done.record(side)``) then comes before that ``copy_``, so on
a GPU it does not cover the write: the caller's stream could read the input while the
side stream still writes it. Eager wrote the input in place where the function said.

Rule: each write-back ``copy_`` into a placeholder moves up to right after the later of its
new value and the last forward node that depends on the input at all (its old value, a
clone of it, or the new value). Inductor assumes a graph's input updates come last: it
replaces a ``clone`` of an input by the input itself, so a node after the write-back that
read such a clone would read the new value. After the last node that depends on the input
nothing can. Every sync after that point in the function comes after the write. AOTAutograd
gives the ``copy_`` its value's stream later (``assign_epilogue_copy_streams``, forward and
inference graphs): set here, it would lend that stream to the backward nodes that share its
sequence number (``inherit_streams``).
"""

from __future__ import annotations

import torch
import torch.fx

from ..compile.graph_compile import GraphCompile
from ..fx.meta import is_backward, record
from .contract import GraphPass

NAME = "write_backs"
COPY = torch.ops.aten.copy_.default


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    notes = []
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    for copy in [n for n in gm.graph.nodes if n.op == "call_function" and n.target is COPY]:
        target, value = copy.args[0], copy.args[1]
        if not (isinstance(target, torch.fx.Node) and target.op == "placeholder"):
            continue
        if not isinstance(value, torch.fx.Node) or copy.users:
            continue
        anchor = max([value, *_forward_dependents(target, copy)], key=order.__getitem__)
        if anchor.next is copy:
            continue
        anchor.append(copy)
        order = {node: i for i, node in enumerate(gm.graph.nodes)}
        note = record(copy, NAME, f"writes {target.name} back right after {anchor.name}")
        notes.append(f"{note.note} [{copy.name}]")
    return notes


def _forward_dependents(placeholder: torch.fx.Node, copy: torch.fx.Node) -> set[torch.fx.Node]:
    """Every forward node that reads ``placeholder``, directly or through other nodes."""
    found: set[torch.fx.Node] = set()
    todo = [placeholder]
    while todo:
        for user in todo.pop().users:
            skip = user is copy or user.op == "output" or is_backward(user)
            if not skip and user not in found:
                found.add(user)
                todo.append(user)
    return found


PASS = GraphPass(NAME, run, ensures=frozenset({"write-backs in place"}))
