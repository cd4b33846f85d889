"""Inductor's generated code for a graph with user streams: its objects resolved at its start,
its stream blocks entered on them, its syncs issued as methods, on every device.

Inductor 2.12+ runs each node of a graph with user streams on its stream: the generated
``call`` enters the node's stream (``with stream1:``; 2.12 writes ``with
torch.cuda.stream(stream1):``, which does nothing without CUDA and refuses a CPU stream with
it), and defines ``streamN`` and ``default_stream`` only where it enters a GPU device guard.
Code for CPU tensors (plain CPU streams, the simulator, the fake accelerator) enters no
guard, so each of its calls failed with ``NameError: name 'stream1' is not defined``,
natively too. Each sync is a ``streams::*`` op call, which resolves its objects by index
through the custom-op dispatcher on every call (about ten times a method call's cost on the
host). While installed, the code Inductor generates for a graph with streams instead:

* starts by resolving the user objects it uses (``user_object0, user_object9, =
  lookup_user_objects((0, 9,))``: the package's lookup, *this* call's objects, its
  binding found once per call), defines
  ``streamN`` as its object and ``default_stream`` as a null context. Inductor leaves one
  stream's block before it enters the next, so the stream current where it enters
  ``default_stream`` is the one the call began on;
* enters each stream block as ``with streamN:`` (``with default_stream:``), on every
  release;
* issues each sync as the method of its objects (``user_object9.record(user_object0)``,
  ``fx.ops.SYNC_METHODS``) where the op's arguments are plain table indices, and leaves out
  the waits its own order makes redundant (``sync_lines``: for a graph the package's
  backend compiles); a backward's record and its one wait between two stream indices that
  may name one stream are issued only when they do not (``if user_object0 !=
  user_object2: user_object9.record(user_object0)``);
* never joins nodes of two streams into one C++ kernel (``_flushed_at_each_stream_switch``),
  nor nodes on either side of a sync (``sync_order.flushed_at_syncs``, on every graph
  with a sync).

Where a GPU device guard defines the stream names again (to the same streams, and
``default_stream`` to the device's current stream), its definitions win inside it; the
definitions above are what the code has before and outside one, and what the CPU suite runs.
C++ and FX wrapper code is left as Inductor writes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
from collections.abc import Callable, Iterator
from typing import Any

from ..fx.ops import OBJECT_ROLES, SYNC_METHODS, SYNC_ROLES, op_name
from ..originals import carries, shadowed
from . import placed_streams, sync_lines, sync_order
from .sync_lines import JUDGEMENT
from .wrapper_lines import CALLERS_STREAM, OBJECT_NAME, block_lines

# The package's resolver of a call's objects, named for what it does in generated code.
LOOKUP = "lookup_user_objects"
_IMPORTS = (
    "from contextlib import nullcontext",
    f"from torch_userstreams.run.lookup import lookup_all as {LOOKUP}",
)
# Inductor's own names (``torch._inductor.stream_constants``), the same in 2.12-2.15.
DEFAULT_STREAM = "default_stream"
STREAM_NAME = "stream{}"

Codegen = Callable[[Any, list[Any]], None]

# How generated code reaches a call's objects: the lines ``definitions`` writes, and the
# stream definitions Inductor 2.12+ writes inside a GPU device guard (native's getter, which
# the package patches into its lookup).
_RESOLVED = re.compile(rf"= {LOOKUP}\(\(([\d, ]*)\)\)")
_GOT_BY_INDEX = re.compile(r"get_external_object_by_index\((\d+)\)")
# A sync op left as an op call resolves its own objects, by indices the code does not name.
_OP_CALL = re.compile(r"torch\.ops\.(streams|userstreams)\.")


def objects_resolved(source: str) -> set[int] | None:
    """The table indices that ``source``, code Inductor generated while installed, resolves
    on each call; None where it may reach others (a sync left as an op call)."""
    if _OP_CALL.search(source):
        return None
    found = {int(i) for i in _GOT_BY_INDEX.findall(source)}
    for indices in _RESOLVED.findall(source):
        found.update(int(i) for i in indices.split(",") if i.strip())
    return found


def definitions(objects: set[int], stream_objects: dict[int, int]) -> list[str]:
    """The lines that resolve each user object in ``objects`` and define ``default_stream``
    and each ``streamN`` Inductor enters, from its map of stream number to table index."""
    used = sorted(objects | set(stream_objects.values()))
    names = ", ".join(OBJECT_NAME.format(i) for i in used)
    indices = ", ".join(str(i) for i in used)
    lines = [f"{names}, = {LOOKUP}(({indices},))"] if used else []
    lines.append(f"{DEFAULT_STREAM} = nullcontext()")
    lines += [
        f"{STREAM_NAME.format(number)} = {OBJECT_NAME.format(index)}"
        for number, index in sorted(stream_objects.items())
    ]
    return lines


def sync_as_method(line: Any) -> tuple[str, set[int]] | None:
    """A wrapper line that calls a sync op, as the method call on its objects, with the
    table indices it names; None for any other line, or a sync it cannot write so."""
    sync = sync_lines.sync_in(line)
    pattern = None if sync is None else SYNC_METHODS.get(op_name(sync.op))
    if sync is None or pattern is None:
        return None
    by_role = dict(zip(SYNC_ROLES[op_name(sync.op)], sync.args, strict=True))
    objects = {role: arg for role, arg in by_role.items() if role in OBJECT_ROLES}
    names = {**by_role, **{role: OBJECT_NAME.format(arg) for role, arg in objects.items()}}
    return pattern.format(**names), set(objects.values())


@functools.cache
def _stream_block_line() -> type:
    """A wrapper line that enters a stream block as ``with streamN:`` (Inductor's own line
    for it spells it per release)."""
    from torch._inductor.codegen.wrapper import WrapperLine

    @dataclasses.dataclass
    class EnterUserStreamLine(WrapperLine):
        name: str

        def codegen(self, code: Any) -> None:
            code.writeline(f"with {self.name}:")
            code.do_indent()

    return EnterUserStreamLine


def _rewritten(line: Any, objects: set[int], guards: sync_lines.Guards) -> Any:
    """``line`` as this module writes it (adding the objects it uses to ``objects``); a
    sync with a guard only where the guard's two streams are different streams."""
    from torch._inductor.codegen import wrapper

    enter, _ = block_lines()
    if isinstance(line, enter):  # the package's own block (2.11)
        objects.add(line.index)
        return line
    upstream: Any = getattr(wrapper, "EnterCudaStreamContextLine", ())  # 2.12+
    if isinstance(line, upstream):
        number = line.stream_idx
        name = DEFAULT_STREAM if number == CALLERS_STREAM else STREAM_NAME.format(number)
        return _stream_block_line()(name)
    direct = sync_as_method(line)
    if direct is None:
        return line
    method, named = direct
    objects |= named
    guard = guards.get(id(line))
    if guard is None:
        return method
    objects.update(guard)
    # Equality, not identity: each call to ``current_stream()`` on CUDA makes a new object
    # for the one stream, and two CUDA streams are equal where they are one.
    one, other = (OBJECT_NAME.format(index) for index in guard)
    return f"if {one} != {other}: {method}"


@contextlib.contextmanager
def _flushed_at_each_stream_switch(scheduler: Any) -> Iterator[None]:
    """Inductor's C++ backend gathers consecutive nodes into one kernel and writes its call
    when flushed; Inductor enters and leaves stream blocks without flushing it, so nodes of
    two streams became one kernel, called in the block of the last (``w.sin()`` on one
    stream and ``w * 0.5`` on another: ``cpp_fused_mul_sin_0``, run on one of them). Each
    stream block now flushes what it gathered before it is left, and before the next is
    entered, as Inductor does for a device guard."""
    native_enter = scheduler.generate_stream_ctx_enter
    native_exit = scheduler.generate_stream_ctx_exit

    def enter(node: Any) -> None:
        scheduler.flush()
        native_enter(node)

    def exit_() -> None:
        scheduler.flush()
        native_exit()

    replacements = {"generate_stream_ctx_enter": enter, "generate_stream_ctx_exit": exit_}
    with shadowed(scheduler, replacements):
        yield


def wrap_codegen(native: Codegen) -> Codegen:
    """The replacement of ``Scheduler._codegen``: native's code for the nodes, rewritten as
    the module docstring says (a graph with one stream is left as it is)."""

    @carries(native)
    def _codegen(self: Any, nodes: list[Any]) -> None:
        from torch._inductor.virtualized import V

        graph = V.graph
        wrapper: Any = graph.wrapper_code  # its lines: Inductor's objects and our strings
        other_wrapper = graph.cpp_wrapper or getattr(graph, "fx_wrapper", False)
        streams = _streams(self)
        if not streams or other_wrapper:
            with sync_order.flushed_at_syncs(self, nodes):
                native(self, nodes)
            return
        start = len(wrapper.lines)
        placed = _placed_by_inductor(self)
        blocks = (
            _flushed_at_each_stream_switch(self)
            if placed
            else placed_streams.StreamBlocks(self, wrapper, streams).around_guards()
        )
        with blocks, sync_order.flushed_at_syncs(self, nodes):
            native(self, nodes)
        objects: set[int] = set()
        # A partition of the graph is not its whole program: what a record there is read by,
        # or what a wait there is covered by, may be in another partition.
        whole = len(nodes) == len(self.nodes)
        judgement = getattr(graph.module, "meta", {}).get(JUDGEMENT) if whole else None
        lines, guards = sync_lines.issued(wrapper.lines[start:], judgement, streams)
        wrapper.lines[start:] = [_rewritten(line, objects, guards) for line in lines]
        for line in _IMPORTS:
            if not wrapper.imports.contains(line):
                wrapper.imports.writeline(line)
        # The package's blocks name their objects; Inductor's name ``streamN``.
        wrapper.lines[start:start] = definitions(objects, streams if placed else {})

    return _codegen


def _placed_by_inductor(scheduler: Any) -> bool:
    """Whether Inductor places each node on its stream itself (2.12+)."""
    return hasattr(scheduler, "stream_idx_to_user_obj_idx")


def _streams(scheduler: Any) -> dict[int, int]:
    """The side streams a graph's nodes run on, by Inductor's number: its own map (2.12+),
    else the package's (``placed_streams``, for a graph it places); empty for a graph on one
    stream."""
    from torch._inductor.virtualized import V

    if _placed_by_inductor(scheduler):
        return scheduler.stream_idx_to_user_obj_idx if scheduler._has_multi_stream_nodes() else {}
    if not placed_streams.placing(V.graph.module):
        return {}
    return placed_streams.numbered(scheduler.nodes)
