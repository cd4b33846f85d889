"""User syncs that reach Dynamo's graph as method calls become ``streams`` ops.

torch 2.11's Dynamo records ``Stream.wait_stream``, ``Stream.wait_event``,
``Stream.synchronize`` and ``Event.synchronize`` as ``call_method`` nodes on the objects'
lookup nodes. AOTAutograd then runs those methods once, on the example objects, while it
traces, and keeps nothing: the sync silently disappears from the compiled code (on a GPU, a
race). Later releases emit ``streams::*`` ops for them. ``rewrite`` gives Dynamo's graph that
later shape before any backend sees it (``PASS``, on Dynamo's graph and on each subgraph it
calls); on those releases it finds nothing to do.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ..errors import UnsupportedPathError
from ..fx.meta import RECORDS, record
from ..fx.ops import is_lookup
from ..run.own_ops import sync_op
from .contract import GraphPass, Rewritten
from .graph_compile import GraphCompile
from .table import UserObjectTable

# Method name -> what it becomes, per receiver kind.
_STREAM_METHODS = ("wait_stream", "wait_event", "synchronize")
_EVENT_METHODS = ("synchronize",)
# Dynamo 2.11 records ``Stream.record_event()`` as a call too, but its result (a new event)
# has no table entry for later syncs to name.
_UNSUPPORTED = ("record_event",)


NAME = "method_syncs"


def run(target: Rewritten, compile_: GraphCompile) -> list[str]:
    """Replace sync method calls on user objects by ops; returns a note per replacement
    (each also recorded on the op that replaced the call)."""
    notes = rewrite(target.graph, compile_.table)
    if notes and isinstance(target, torch.fx.GraphModule):
        target.recompile()  # a subgraph's module: its code calls the ops now
    return notes


# Ensures no fact: Dynamo's graph is rewritten once, before any pass that could require one.
PASS: GraphPass[Rewritten] = GraphPass(NAME, run)


def rewrite(graph: torch.fx.Graph, table: UserObjectTable) -> list[str]:
    """``run`` on the graph itself."""
    notes = []
    for node in list(graph.nodes):
        if node.op != "call_method" or not node.args:
            continue
        receiver = _object_index(node.args[0])
        if receiver is None:
            continue
        example = table.example(receiver)
        if node.target in _UNSUPPORTED:
            raise _unsupported(node, example, table)
        op_and_args = _as_op(node, receiver, example, table)
        if op_and_args is None:
            continue
        with graph.inserting_before(node):
            new = graph.call_function(*op_and_args)
        new.meta = dict(node.meta)
        new.meta.pop(RECORDS, None)  # the call's records are not the op's
        note = record(new, NAME, f"{type(example).__name__}.{node.target}() as an op")
        notes.append(f"{note.note} [{new.name}]")
        node.replace_all_uses_with(new)
        graph.erase_node(node)
    return notes


def _object_index(arg: Any) -> int | None:
    """The table index a lookup node reads, or None if ``arg`` is not one."""
    if not isinstance(arg, torch.fx.Node) or arg.op != "call_function":
        return None
    if not is_lookup(arg.target):
        return None
    index = arg.args[0] if arg.args else None
    return index if type(index) is int else None


def _as_op(
    node: torch.fx.Node,
    receiver: int,
    example: Any,
    table: UserObjectTable,
) -> tuple[Any, tuple[int, ...]] | None:
    name = node.target
    if isinstance(example, torch.Event):
        return (sync_op("synchronize_event"), (receiver,)) if name in _EVENT_METHODS else None
    if not isinstance(example, torch.Stream) or name not in _STREAM_METHODS:
        return None
    if name == "synchronize":
        return sync_op("synchronize_stream"), (receiver,)
    other = _object_index(node.args[1] if len(node.args) > 1 else None)
    if other is None:
        raise _unsupported(node, example, table)
    if name == "wait_stream":
        return sync_op("wait_stream"), (receiver, other)
    return sync_op("wait_event"), (other, receiver)  # stream.wait_event(event)


def _unsupported(node: torch.fx.Node, example: Any, table: UserObjectTable) -> Exception:
    return UnsupportedPathError(
        f"torch_userstreams: graph {table.graph_name} calls {type(example).__name__}."
        f"{node.target}() (node {node.name}) in a way this torch's Dynamo records as a plain "
        "method call, which the compiled code would silently drop. Spell it with events: "
        "`event.record(stream)` and `event.wait(other_stream)` reach every supported torch."
    )
