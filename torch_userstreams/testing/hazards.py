"""Cross-stream hazards of a graph, from its accesses and its happens-before relation.

Rules:

* Data races: two accesses of one buffer on different streams, at least one a write, where
  the earlier does not happen-before the later: read-after-write (RAW), write-after-read
  (WAR) or write-after-write (WAW). An allocation is a write by the allocating kernel; an
  in-place or ``out=`` op writes its aliased argument; mutating an input is a write to it.
  Inputs exist before the graph starts, so reading one is never a hazard.
* Memory reuse: the caching allocator returns a buffer to the stream that allocated it (A)
  once its last reference in the graph is gone, and A's next allocation may take it at once.
  Every access from another stream B must therefore happen-before A's first allocation after
  that release (or, with none, before the graph ends: the caller allocates on A next), unless
  ``record_stream(buffer, B)`` told the allocator about B. Buffers that escape through the
  graph's output and inputs are owned by the caller and skipped.

One finding per earlier access and later stream: the fix for the first later access fixes
the ones after it on that stream.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .graph_view import Access, Buffer, GraphView, Kernel, StreamKey, Sync
from .happens_before import HappensBefore

END_OF_GRAPH = "<end of graph>"


class HazardKind(enum.Enum):
    RAW = "read-after-write"
    WAR = "write-after-read"
    WAW = "write-after-write"
    MEMORY_REUSE = "memory-reuse"


@dataclass(frozen=True)
class Finding:
    """One hazard: ``first`` (on ``first_stream``) is not ordered before ``second``."""

    kind: HazardKind
    buffer: str  # the node that allocated the memory (or the input's placeholder)
    first: str
    first_stream: StreamKey
    second: str  # a node name, or END_OF_GRAPH
    second_stream: StreamKey
    fix: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.detail}\n    fix: {self.fix}"


StreamName = Callable[[StreamKey], str]


@dataclass
class _Use:
    kernel: Kernel
    access: Access


def _uses(view: GraphView) -> dict[Buffer, list[_Use]]:
    uses: dict[Buffer, list[_Use]] = {buffer: [] for buffer in view.buffers}
    for step in view.steps:
        if isinstance(step, Kernel):
            for access in step.accesses:
                uses[access.buffer].append(_Use(step, access))
    return uses


def _race_kind(first: Access, second: Access) -> HazardKind | None:
    if first.write:
        return HazardKind.WAW if second.write else HazardKind.RAW
    return HazardKind.WAR if second.write else None


def data_races(view: GraphView, hb: HappensBefore, name: StreamName) -> Iterator[Finding]:
    """RAW, WAR and WAW between streams (see the module docstring)."""
    for buffer, uses in _uses(view).items():
        reported: set[tuple[int, StreamKey]] = set()
        for j, later in enumerate(uses):
            for i in range(j):
                earlier = uses[i]
                kind = _race_kind(earlier.access, later.access)
                key = (i, later.kernel.stream)
                if kind is None or key in reported or _same_stream(earlier, later):
                    continue
                if not hb.ordered(earlier.kernel, later.kernel):
                    reported.add(key)
                    yield _race(kind, buffer, earlier.kernel, later.kernel, name)


def _same_stream(first: _Use, second: _Use) -> bool:
    return first.kernel is second.kernel or first.kernel.stream == second.kernel.stream


def _race(
    kind: HazardKind, buffer: Buffer, first: Kernel, second: Kernel, name: StreamName
) -> Finding:
    a, b = first.node.name, second.node.name
    s, t = name(first.stream), name(second.stream)
    verb = {HazardKind.RAW: "reads", HazardKind.WAR: "writes", HazardKind.WAW: "writes"}[kind]
    return Finding(
        kind=kind,
        buffer=buffer.name,
        first=a,
        first_stream=first.stream,
        second=b,
        second_stream=second.stream,
        fix=f"record an event on {s} after {a} and wait for it on {t} before {b}",
        detail=f"{b} on {t} {verb} {buffer.name} while {a} on {s} may still access it",
    )


def _record_streams(view: GraphView) -> set[tuple[Buffer, StreamKey]]:
    """``record_stream(buffer, stream)`` calls: the allocator waits for that stream."""
    marked = set()
    for step in view.steps:
        if isinstance(step, Sync) and step.name == "record_stream":
            buffer, stream = step.args[0], step.args[1]
            if isinstance(buffer, Buffer):
                marked.add((buffer, stream))
    return marked


def _next_allocation(view: GraphView, stream: StreamKey, after: int) -> Kernel | None:
    for step in view.steps:
        if isinstance(step, Kernel) and step.position > after and step.stream == stream:
            if step.allocates:
                return step
    return None


def memory_reuse(view: GraphView, hb: HappensBefore, name: StreamName) -> Iterator[Finding]:
    """Memory another stream may still use when its allocating stream reuses it."""
    marked = _record_streams(view)
    for buffer, uses in _uses(view).items():
        if buffer.producer is None or buffer.escapes:
            continue
        last_on: dict[StreamKey, Kernel] = {}
        for use in uses:
            if use.kernel.stream != buffer.stream and (buffer, use.kernel.stream) not in marked:
                last_on[use.kernel.stream] = use.kernel
        if not last_on:
            continue
        reuse = _next_allocation(view, buffer.stream, view.release[buffer])
        for last in last_on.values():
            safe = (
                hb.ordered(last, reuse)
                if reuse is not None
                else hb.ordered_before_end(last, buffer.stream)
            )
            if not safe:
                yield _reuse(buffer, last, reuse, name)


def _reuse(buffer: Buffer, last: Kernel, reuse: Kernel | None, name: StreamName) -> Finding:
    a, b = name(buffer.stream), name(last.stream)
    where = reuse.node.name if reuse is not None else END_OF_GRAPH
    before = f"before {where}" if reuse is not None else "before the graph ends"
    when = f"at {where}" if reuse is not None else "once the graph returns"
    return Finding(
        kind=HazardKind.MEMORY_REUSE,
        buffer=buffer.name,
        first=last.node.name,
        first_stream=last.stream,
        second=where,
        second_stream=buffer.stream,
        fix=(
            f"record an event on {b} after {last.node.name} and make {a} wait for it "
            f"(sync_dealloc of {buffer.name}) {before}"
        ),
        detail=(
            f"{buffer.name} was allocated on {a} and is used by {last.node.name} on {b}; "
            f"{a} may reuse its memory {when} while {last.node.name} still runs"
        ),
    )
