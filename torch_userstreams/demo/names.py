"""The user's names for a graph's streams and events: the timeline's lanes and labels.

A table entry says where its object comes from (``L['side']`` for an argument, what the
function called for one it makes), not the variable the user's code holds it in. That name
is in the user's source: each sync the user wrote (``ready.wait(side)``) keeps its stack
trace, whose last line is the call, and its module path (``nn_module_stack``), and the
sync op's operands are the table indices of the event and the stream. So that call in
module ``model.blocks.0`` names the event ``model.blocks.0.ready`` and the stream
``model.blocks.0.side``. Only the user's objects are named so (those the function makes or
loads, not those a pass asked for); an argument no call names keeps its source
(``L['side']`` is ``side``); an index two calls name differently, or a name two indices
get, keeps the index.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch.fx

from ..compile.table import EntryKind, UserObjectTable
from ..fx.control_deps import sync_node, sync_of
from ..fx.ops import op_name

CURRENT = "current"
_USERS = (EntryKind.GRAPH_CREATED, EntryKind.INPUT)  # what the user's code holds by name
# (sync op, method the user called) -> (operand the receiver is, operand the argument is)
_CALLS: dict[tuple[str, str], tuple[int, int | None]] = {
    ("record_event", "record"): (0, 1),
    ("record_event", "record_event"): (1, 0),
    ("wait_event", "wait"): (0, 1),
    ("wait_event", "wait_event"): (1, 0),
    ("wait_stream", "wait_stream"): (0, 1),
    ("synchronize_event", "synchronize"): (0, None),
}
_FRAME_LINE = re.compile(r'^\s*File ".*", line \d+, in ')
_SOURCE = re.compile(r"^[LG]\['([^']+)'\]")


def source_expression(origin: str) -> str:
    """``L['side']`` as the user's code writes it (``side``); ``L['self'].s`` is ``self.s``."""
    return _SOURCE.sub(r"\1", origin)


def entry_names(
    table: UserObjectTable | None, graphs: list[tuple[str, torch.fx.GraphModule]]
) -> dict[int, str]:
    """{table index: the user's name} for every entry that has one (see the module
    docstring); the current stream is ``current`` (with its device when there are two)."""
    if table is None:
        return {}
    devices = {str(e.device) for e in table.entries if e.kind is EntryKind.CURRENT_STREAM}
    found: dict[int, set[str]] = defaultdict(set)
    for _, gm in graphs:
        for index, name in _call_site_names(gm):
            found[index].add(name)
    names: dict[int, str] = {}
    for entry in table.entries:
        if entry.kind is EntryKind.CURRENT_STREAM:
            names[entry.index] = CURRENT if len(devices) < 2 else f"{CURRENT} ({entry.device})"
        elif entry.kind in _USERS and len(found[entry.index]) == 1:
            names[entry.index] = next(iter(found[entry.index]))
        elif entry.kind is EntryKind.INPUT:
            names[entry.index] = source_expression(entry.origin)
    return _unique(names)


def _unique(names: dict[int, str]) -> dict[int, str]:
    """A name several indices got (a stream made in a loop) is told apart by the index."""
    holders: dict[str, list[int]] = defaultdict(list)
    for index, name in names.items():
        holders[name].append(index)
    return {i: name if len(holders[name]) == 1 else f"{name} [{i}]" for i, name in names.items()}


def _call_site_names(gm: torch.fx.GraphModule) -> Iterator[tuple[int, str]]:
    """(table index, name) for the operands of each sync the user's code called by name."""
    for node in gm.graph.nodes:
        op_node, sync = sync_node(gm, node), sync_of(gm, node)
        if op_node is None or sync is None:
            continue
        meta = op_node.meta  # the op's own: a control_deps wrapper keeps no stack trace
        call = _user_call(meta.get("stack_trace"), op_name(sync.op))
        if call is None:
            continue
        prefix = _module_path(meta.get("nn_module_stack"))
        for position, expression in call:
            index = sync.args[position] if position < len(sync.args) else None
            if type(index) is int:
                yield index, _qualified(prefix, expression)


def _user_call(stack_trace: Any, op: str) -> list[tuple[int, str]] | None:
    """[(operand position, the expression the user wrote for it)] of the one call on the
    stack trace's last source line that issues ``op``; None if there is not exactly one."""
    lines = str(stack_trace or "").splitlines()
    frames = [i for i, line in enumerate(lines) if _FRAME_LINE.match(line)]
    if not frames or frames[-1] + 1 >= len(lines):
        return None
    try:
        tree = ast.parse(lines[frames[-1] + 1].strip())
    except SyntaxError:  # a statement over several lines, or a `with` header
        return None
    calls = [
        (node, _CALLS[(op, node.func.attr)])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and (op, node.func.attr) in _CALLS
    ]
    if len(calls) != 1:
        return None
    call, (receiver, argument) = calls[0]
    named = [(receiver, _dotted(call.func.value))]  # type: ignore[attr-defined]
    if argument is not None and call.args:
        named.append((argument, _dotted(call.args[0])))
    return [(position, text) for position, text in named if text is not None]


def _dotted(node: ast.expr) -> str | None:
    """``side`` or ``self.side``: a plain name the user holds the object in, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and _dotted(node.value) is not None:
        return ast.unparse(node)
    return None


def _module_path(stack: Any) -> str:
    """The innermost module's path below the compiled one (``model.blocks.0``), or ''."""
    if not isinstance(stack, dict) or not stack:
        return ""
    path = source_expression(str(list(stack.values())[-1][0]))
    return "" if path == "self" else path.removeprefix("self.")


def _qualified(prefix: str, expression: str) -> str:
    """``model.blocks.0`` + ``ready`` (or ``self.ready``): ``model.blocks.0.ready``."""
    expression = expression.removeprefix("self.")
    return f"{prefix}.{expression}" if prefix else expression
