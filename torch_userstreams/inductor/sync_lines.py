"""The syncs a graph compiled as one call issues: Inductor's lines for its ``call``, read as
the program they run, without the waits that program does not need.

The graph's order is not the order its code runs in: Inductor computes a pointwise value
where a later node reads it, so work the graph has before a record may run after it (only
the values a record is pinned after are computed before it, ``reuse_syncs``). Which waits
are redundant (``inductor.redundant_syncs``) is therefore judged on the lines Inductor
wrote, once its scheduler has placed every node: each line inside ``with streamN:`` is
work on that stream (outside any block, or in ``default_stream``'s, on the stream the call
began on), each sync line the sync it issues. A line that runs nothing on a stream (a
comment, a check of an input's size) is no step; any other line is work, which only keeps
more syncs. Only a whole graph is judged (a partition's records may be read in another),
and not one with a sync line this cannot read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from ..fx.control_deps import SyncCall
from ..fx.ops import OBJECT_ROLES, SYNC_ROLES, is_sync_op, op_name
from .wrapper_lines import CALLERS_STREAM, block_kinds, writes_no_code

# Where a graph the package's backend compiles as one call carries its ``Judge``
# (``inductor.redundant_syncs.Judgement``, plain data: a graph's meta is pickled into
# Inductor's FX graph cache key). A graph without one keeps every sync.
JUDGEMENT = "torch_userstreams.sync_judgement"


class Judge(Protocol):
    def without_redundant_waits(self, steps: list[Any]) -> list[Any]:
        """``steps`` (syncs, and work on a stream) without the syncs that order nothing."""

    def pairs_on_one_stream(self, steps: list[Any]) -> dict[int, tuple[int, int]]:
        """The positions of the syncs in ``steps`` that order nothing when two stream
        indices name one stream at run time, each with those two indices."""


@dataclass(eq=False)
class Work:
    """A line that runs on ``stream`` (a table index; None: the stream the call began on)."""

    stream: int | None


def _sync_op(line: Any) -> Any:
    """The sync op a wrapper line calls (a ``streams::*`` fallback), or None."""
    from torch._inductor.codegen.wrapper import ExternKernelAllocLine

    if not isinstance(line, ExternKernelAllocLine):
        return None
    target = getattr(line.node, "op_overload", None)
    return target if target is not None and is_sync_op(target) else None


def sync_in(line: Any) -> SyncCall | None:
    """The sync a wrapper line issues (its table indices as ints), or None: the line is
    no sync op's call, or its arguments are not plain table indices."""
    from torch._inductor import ir

    target = _sync_op(line)
    node: Any = getattr(line, "node", None)
    if target is None or not isinstance(node.layout, ir.NoneLayout):
        return None
    roles = SYNC_ROLES.get(op_name(target), ())
    args, has_kwargs = _arguments(node)
    if has_kwargs or node.codegen_kwargs() or len(args) != len(roles):
        return None
    values: list[Any] = []
    for role, arg in zip(roles, args, strict=True):
        if role in OBJECT_ROLES and not arg.isdigit():
            return None
        values.append(int(arg) if role in OBJECT_ROLES else arg)
    return SyncCall(None, target, tuple(values))


class _Operand:
    """A tensor operand of a sync, written as the name Inductor's code gives its buffer."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def _arguments(node: Any) -> tuple[list[str], bool]:
    """A sync call's positional arguments as Inductor's wrapper writes them, and whether it
    has keyword arguments: what ``FallbackKernel.codegen_args`` gives, without the class it
    defines on each call (about 0.5 ms each; each sync's line is read several times while a
    graph's code is written) and without recording the keywords on the node."""
    from torch._inductor.virtualized import V

    if not callable(getattr(node, "unflatten_args", None)):  # not a fallback kernel
        return [str(arg) for arg in node.codegen_args()], False
    operands = [_Operand(operand.codegen_reference()) for operand in node.inputs]
    args, kwargs = node.unflatten_args(operands, node.constant_args)
    write = V.graph.wrapper_code.val_to_arg_str
    return [write(arg) for arg in args], bool(kwargs)


# Each sync line issued only when two stream indices name different streams, by the line's
# id: the two indices (``redundant_syncs.pairs_on_one_stream``).
Guards = dict[int, tuple[int, int]]


def issued(
    lines: list[Any], judgement: Judge | None, streams: dict[int, int]
) -> tuple[list[Any], Guards]:
    """``lines`` without the syncs ``judgement`` finds redundant in the program they run,
    and the guards of those it finds needed only when two stream indices name different
    streams; ``streams`` maps Inductor's stream numbers to table indices. Unchanged, with no
    guard, where there is no judgement, a block enters a stream it cannot name, or a sync's
    line cannot be read as the sync it issues."""
    if judgement is None:
        return lines, {}
    steps: list[SyncCall | Work] = []
    written: dict[int, Any] = {}  # each sync step's line, by the step's id
    stream: int | None = None  # the stream the call began on
    enters, exits = block_kinds()
    for line in lines:
        if isinstance(line, enters):
            if line.stream_idx != CALLERS_STREAM and line.stream_idx not in streams:
                return lines, {}
            stream = None if line.stream_idx == CALLERS_STREAM else streams[line.stream_idx]
        elif isinstance(line, exits):
            stream = None
        elif not _no_work(line):
            sync = sync_in(line)
            if sync is None and _sync_op(line) is not None:
                return lines, {}
            steps.append(sync if sync is not None else Work(stream))
            written[id(steps[-1])] = line
    kept_steps = judgement.without_redundant_waits(steps)
    kept = {id(step) for step in kept_steps}
    left_out = {id(line) for step, line in written.items() if step not in kept}
    guards = {
        id(written[id(kept_steps[position])]): guard
        for position, guard in judgement.pairs_on_one_stream(kept_steps).items()
    }
    return _joined_blocks([line for line in lines if id(line) not in left_out]), guards


def _joined_blocks(lines: list[Any]) -> list[Any]:
    """``lines`` without the stream blocks the syncs left out emptied, a block of nothing but
    syncs on the current stream joined to the block before it, and two blocks of one stream
    that nothing but comments separates joined into one: each block entered costs the host
    a stream switch and its return. Only a block that follows a closed block, or opens the
    code, is joined or taken out (there, what holds it keeps other lines); the last block
    Inductor leaves open (a device guard's exit closes it) stays open, and an emptied block
    that stays gets a ``pass``."""
    enters, exits = block_kinds()
    # The lines as segments: a block (its enter line, its lines, its exit line or None), or
    # lines outside any block (enter None).
    segments: list[tuple[Any, list[Any], Any]] = []
    for line in lines:
        if isinstance(line, enters):
            segments.append((line, [], None))
        elif isinstance(line, exits) and segments and segments[-1][0]:
            enter, body, _ = segments[-1]
            segments[-1] = (enter, body, line)
        elif segments and (segments[-1][2] is None or writes_no_code(line)):
            segments[-1][1].append(line)  # in the open block, or a comment after a block
        else:
            segments.append((None, [line], None))
    joined: list[tuple[Any, list[Any], Any]] = []
    for enter, body, exit_ in segments:
        last = joined[-1] if joined else None
        if enter is None:
            joined.append((enter, body, exit_))
            continue
        after_a_block = last is not None and last[0] is not None and last[2] is not None
        emptied = all(map(writes_no_code, body))
        if emptied and exit_ is not None and (last is None or after_a_block):
            continue
        if last is not None and after_a_block and _joins(last[0], enter, body):
            joined[-1] = (last[0], last[1] + body, exit_)
            continue
        joined.append((enter, [*body, "pass"] if emptied else body, exit_))
    return [
        line
        for enter, body, exit_ in joined
        for line in ([enter] if enter else []) + body + ([exit_] if exit_ else [])
    ]


def _joins(last: Any, enter: Any, body: list[Any]) -> bool:
    """Whether a block can go on in the block before it: it is of the same stream, or it is
    ``default_stream``'s and runs nothing but syncs, frees and checks of an input's size:
    each sync names the streams it acts on, and the others run on the host alone."""
    from torch._inductor.codegen.wrapper import FreeIfNotReusedLine, FreeLine

    if last.stream_idx == enter.stream_idx:
        return True
    if enter.stream_idx != CALLERS_STREAM:
        return False
    host_only = (FreeLine, FreeIfNotReusedLine)
    return all(
        _no_work(line) or isinstance(line, host_only) or sync_in(line) is not None for line in body
    )


def _no_work(line: Any) -> bool:
    """Whether ``line`` runs nothing on a stream: it writes no statement, or it is the
    host's check of an input's size and strides."""
    from torch._inductor.codegen import wrapper

    # (2.11 writes these checks before the lines, not among them.)
    checks = getattr(wrapper, "AssertSizeStrideLine", ())
    return writes_no_code(line) or isinstance(line, checks)
