"""An input's in-graph write-back runs where the function updated the input.

AOTAutograd keeps an update of a graph input (a buffer's running statistics, an EMA, a
gradient scaled in a hook) in the graph as a ``copy_`` into the input at the very end, on
the stream that computed the new value. A join the function wrote after the update
(``main.wait_stream(side)``, ``done.record(side)``) then comes before that ``copy_``, so on
a GPU it does not cover the write: the caller's stream could read the input while the
side stream still writes it. Eager wrote the input in place where the function said.

Rule: each write-back ``copy_`` into a placeholder moves up to right after the later of its
new value and the last forward node that depends on the input other than through the new
value alone: its old value, a view or a clone of it, anything computed from those. Inductor
assumes a graph's input updates come last and replaces nodes by their inputs where that is
a no-op (a ``clone``, ``v + zeros``, ``v * ones`` of a view ``v`` of the input), so a node
after the write-back that read such a node could read the new value. Nodes that read the
new value only read its own buffer (Inductor realizes pending reads of a buffer before it
lowers the buffer's mutation): they may follow the write, so a join written between the
update and such a read (``main.wait_stream(side); return x + ema``) covers the write. A
join before a read of the old value, though, still comes before the write, as natively.
A write-back whose input's old value another write-back reads (a swap through a clone)
stays where AOTAutograd put it: no order of such writes is right, and AOTAutograd's is
what native runs.
AOTAutograd gives a training graph's ``copy_`` its value's stream later
(``assign_epilogue_copy_streams``; in inference graphs it already has it): set here, it
would lend that stream to the backward nodes that share its sequence number
(``inherit_streams``).
"""

from __future__ import annotations

import torch
import torch.fx

from ..compile.contract import Fact, GraphPass
from ..compile.graph_compile import GraphCompile
from ..fx.meta import is_backward, record
from ..fx.ops import is_view

NAME = "write_backs"
COPY = torch.ops.aten.copy_.default


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    notes = []
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    write_backs = [n for n in gm.graph.nodes if _is_write_back(n)]
    for copy in write_backs:
        target, value = copy.args[0], copy.args[1]
        readers = _old_value_readers(target, copy, value)
        if readers.intersection(write_backs):
            continue  # another write-back reads this input's old value (a swap): keep AOT's order
        anchor = max([value, *readers], key=order.__getitem__)
        if anchor.next is copy:
            continue
        anchor.append(copy)
        order = {node: i for i, node in enumerate(gm.graph.nodes)}
        note = record(copy, NAME, f"writes {target.name} back right after {anchor.name}")
        notes.append(f"{note.note} [{copy.name}]")
    return notes


def _is_write_back(node: torch.fx.Node) -> bool:
    """AOTAutograd's ``copy_`` of a new value into a graph input, whose result nothing reads."""
    return not node.users and copies_into_input(node)


def copies_into_input(node: torch.fx.Node) -> bool:
    """A ``copy_`` of a value into a graph input: a write-back, read by a sync or not."""
    if node.op != "call_function" or node.target is not COPY:
        return False
    target, value = node.args[0], node.args[1]
    return (
        isinstance(target, torch.fx.Node)
        and target.op == "placeholder"
        and isinstance(value, torch.fx.Node)
    )


def _old_value_readers(
    placeholder: torch.fx.Node, copy: torch.fx.Node, value: torch.fx.Node
) -> set[torch.fx.Node]:
    """Every forward node, and every other write-back, that depends on ``placeholder``
    other than through the new ``value`` alone."""
    found: set[torch.fx.Node] = set()
    todo = [placeholder]
    while todo:
        for user in todo.pop().users:
            # AOTAutograd tags write-backs as backward nodes; another one is a reader here
            backward = is_backward(user) and not _is_write_back(user)
            if user is copy or user.op == "output" or backward or user in found:
                continue
            found.add(user)
            if user is not value and not _makes_new_buffers(user):
                todo.append(user)
    return found


def _makes_new_buffers(node: torch.fx.Node) -> bool:
    """An op that returns several new tensors (``_native_batch_norm_legit_functional``):
    it reads the old value itself, but which of its outputs it computed from that value
    the graph does not say, and none of them can stand for the input's buffer. Following
    them made BatchNorm's running mean depend on the running variance's update, and kept
    both write-backs after the user's join."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload) or is_view(node):
        return False
    return len(target._schema.returns) > 1


PASS = GraphPass(NAME, run, ensures=frozenset({Fact.WRITE_BACKS_IN_PLACE}))
