"""Inductor's generated code for a graph with user streams: its objects resolved once per
call, its syncs issued as methods, on every device.

Inductor 2.12+ runs each node of a graph with user streams on its stream: the generated
``call`` enters ``with stream1:`` (``with default_stream:`` to go back), and defines those
names only where it enters a GPU device guard. Code for CPU tensors (plain CPU streams, the
simulator, the fake accelerator) enters no guard, so each of its calls failed with
``NameError: name 'stream1' is not defined``, natively too. Each sync is a ``streams::*``
op call, which resolves its objects by index through the custom-op dispatcher on every call
(about ten times a method call's cost on the host). While installed, the code of a graph
with streams instead starts by resolving each user object it uses, once
(``uN = get_external_object_by_index(N)``: the package's lookup, *this* call's object), and:

* defines ``streamN`` as its object, and ``default_stream`` as a null context: Inductor
  leaves one stream's block before it enters the next, so the stream current where it
  enters ``default_stream`` is the one the call began on;
* issues each sync as the method of its objects (``u9.record(u0)``, ``fx.ops.SYNC_METHODS``)
  where the op's arguments are plain table indices.

A GPU graph's device guard defines the stream names again, to the same streams and its
current stream, so the CPU suite runs the lines a GPU's code starts with. C++ wrapper code
is left as Inductor writes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..fx.ops import OBJECT_ROLES, SYNC_METHODS, SYNC_ROLES, is_sync_op, op_name
from ..originals import carries

_IMPORTS = (
    "from contextlib import nullcontext",
    "from torch._dynamo.graph_bytecode_inputs import get_external_object_by_index",
)
# Inductor's own names (``torch._inductor.stream_constants``), the same in 2.12-2.15.
DEFAULT_STREAM = "default_stream"
STREAM_NAME = "stream{}"
OBJECT_NAME = "u{}"

Codegen = Callable[[Any, list[Any]], None]


def definitions(objects: set[int], stream_objects: dict[int, int]) -> list[str]:
    """The lines that resolve each user object in ``objects`` and define ``default_stream``
    and each ``streamN`` Inductor enters, from its map of stream number to table index."""
    used = sorted(objects | set(stream_objects.values()))
    lines = [f"{OBJECT_NAME.format(i)} = get_external_object_by_index({i})" for i in used]
    lines.append(f"{DEFAULT_STREAM} = nullcontext()")
    lines += [
        f"{STREAM_NAME.format(number)} = {OBJECT_NAME.format(index)}"
        for number, index in sorted(stream_objects.items())
    ]
    return lines


def sync_as_method(line: Any) -> tuple[str, set[int]] | None:
    """A wrapper line that calls a sync op, as the method call on its objects, with the
    table indices it names; None for any other line, or a sync it cannot write so."""
    from torch._inductor import ir

    node: Any = getattr(line, "node", None)
    target = getattr(node, "op_overload", None)
    if target is None or not is_sync_op(target) or not isinstance(node.layout, ir.NoneLayout):
        return None
    name = op_name(target)
    pattern, roles = SYNC_METHODS.get(name), SYNC_ROLES.get(name, ())
    args = [str(arg) for arg in node.codegen_args()]
    if pattern is None or node.codegen_kwargs() or len(args) != len(roles):
        return None
    by_role = dict(zip(roles, args, strict=True))
    objects = {role: arg for role, arg in by_role.items() if role in OBJECT_ROLES}
    if not all(arg.isdigit() for arg in objects.values()):
        return None
    names = {**by_role, **{role: OBJECT_NAME.format(arg) for role, arg in objects.items()}}
    return pattern.format(**names), {int(arg) for arg in objects.values()}


def wrap_codegen(native: Codegen) -> Codegen:
    """The replacement of ``Scheduler._codegen``: native's code for the nodes, its syncs as
    methods, after the definitions (a graph with one stream is left as it is)."""

    @carries(native)
    def _codegen(self: Any, nodes: list[Any]) -> None:
        from torch._inductor.virtualized import V

        wrapper: Any = V.graph.wrapper_code  # its lines: Inductor's objects and our strings
        if not self._has_multi_stream_nodes() or V.graph.cpp_wrapper:
            native(self, nodes)
            return
        start = len(wrapper.lines)
        native(self, nodes)
        objects: set[int] = set()
        for at in range(start, len(wrapper.lines)):
            direct = sync_as_method(wrapper.lines[at])
            if direct is not None:
                wrapper.lines[at], indices = direct
                objects |= indices
        for line in _IMPORTS:
            if not wrapper.imports.contains(line):
                wrapper.imports.writeline(line)
        wrapper.lines[start:start] = definitions(objects, self.stream_idx_to_user_obj_idx)

    return _codegen
