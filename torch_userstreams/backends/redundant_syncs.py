"""Waits a program does not need: the waiting stream is already ordered after the event.

The package's passes place a sync for each value or buffer that crosses streams, one by
one: a backward's exit joins every gradient's stream back to the current stream with an
event each, although one wait for the last of them orders the others too (a stream runs its
work in order). Each sync costs the host a call per step (1-3 us on CUDA, more through
Python), so ``without_redundant_waits`` drops, from the steps ``regions.split`` made:

* a ``wait_event`` of a package-made event whose record the waiting stream already comes
  after: through its own order, or through the waits it issued before (vector clocks over
  the program's streams, in issue order);
* a ``wait_event`` of a package-made event that a later wait of the same stream covers,
  with nothing between them that reads the waiting stream's order (work on it, a record
  on it, a ``wait_stream`` for it): a backward's exit waits for two events recorded on one
  side stream, the second after more work there, and only the second wait is needed;
* then the record of a package-made event nothing reads any more.

Only package-made events (``holdable``) are judged: each is an object no other index names,
recorded and waited only where the passes put it. A user's event may be timed, queried or
passed twice; its syncs stay. A wait for what this cannot see (a user's event, one recorded
before the graph) orders its stream after a point of its own, which a record there passes
on: a stream that did not wait for that point through the same syncs is not after that
record. A wait this cannot read (a stream or event that is no table index) stops the
judgement: every sync stays.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ..compile.table import EntryKind, UserObjectTable
from ..fx.control_deps import SyncCall
from ..fx.ops import op_name, operands

# A program's steps in issue order: each a sync, or work on a stream (anything else with a
# ``stream``: a ``Region``, or a line of Inductor's code, ``patch.sync_lines``).
Step = Any

Clock = dict[Hashable, int]


def _after(earlier: Clock, later: Clock) -> bool:
    """Whether every point of ``earlier`` is covered by ``later``."""
    return all(later.get(stream, 0) >= point for stream, point in earlier.items())


def _join(into: Clock, other: Clock) -> None:
    for stream, point in other.items():
        if into.get(stream, 0) < point:
            into[stream] = point


@dataclass(frozen=True)
class _Unknown:
    """A point no step here can name: what a user's event, an event recorded before the
    graph or an unreadable sync orders its stream after. A stream is after it only if it
    waited for it, through the same chain of syncs."""

    position: int


class _Streams:
    """What each stream is ordered after, as the steps are issued."""

    def __init__(self, current: frozenset[int]) -> None:
        self.current = current
        self.clocks: dict[Hashable, Clock] = {}

    def key(self, index: Any) -> Hashable:
        return None if index in self.current else index

    def clock(self, stream: Hashable) -> Clock:
        # Point 1 is the stream's work before the graph (an incoming gradient, the caller's
        # work): a record there covers it, and no other stream is known to be after it.
        return self.clocks.setdefault(stream, {stream: 1})

    def work(self, stream: Hashable) -> None:
        self.clock(stream)[stream] += 1

    def point(self, stream: Hashable) -> Clock:
        return dict(self.clock(stream))


def without_redundant_waits(
    steps: list[Step], holdable: Callable[[Any], bool], current: frozenset[int] = frozenset()
) -> list[Step]:
    """``steps`` without the redundant waits and the unread records of package-made events
    (see the module docstring); ``current`` are the indices of the current stream, the one
    unannotated regions (stream None) run on."""
    streams = _Streams(current)
    walked = _walk(steps, holdable, streams)
    if walked is None:
        return list(steps)
    dropped, waits = walked
    dropped |= _covered_by_a_later_wait(steps, dropped, waits, streams)
    kept = [step for position, step in enumerate(steps) if position not in dropped]
    read = {_event(step) for step in kept if isinstance(step, SyncCall) and _reads_event(step)}
    return [step for step in kept if not _unread_record(step, read, holdable)]


def _walk(
    steps: list[Step], holdable: Callable[[Any], bool], streams: _Streams
) -> tuple[set[int], dict[int, _Wait]] | None:
    """The waits already covered where they are issued, and each wait kept whose event's
    record is known, in issue order; None when a stream this cannot name waits."""
    recorded: dict[Any, Clock] = {}  # event -> the point its last record marks
    dropped: set[int] = set()
    waits: dict[int, _Wait] = {}
    for position, step in enumerate(steps):
        if not isinstance(step, SyncCall):
            streams.work(streams.key(step.stream))
            continue
        name = op_name(step.op)
        sync = operands(name, step.args)
        if name == "record_event":
            _note_record(sync, recorded, holdable, streams)
        elif _waits_unnamed(name, sync):
            return None
        elif name in ("wait_event", "sync_dealloc"):
            wait = _judge_wait(name, sync, recorded.get(sync.event), streams, position)
            if wait is None:
                dropped.add(position)
            elif wait.mark:
                waits[position] = wait
        elif name == "wait_stream":
            _join(streams.clock(streams.key(sync.stream)), streams.point(streams.key(sync.waited)))
        # A host sync orders all later work after it alike, the waits judged and the records
        # they wait for: nothing this judgement relies on. A record_stream orders nothing.
    return dropped, waits


def _note_record(
    sync: Any, recorded: dict[Any, Clock], holdable: Callable[[Any], bool], streams: _Streams
) -> None:
    """The point a package-made event's record marks; a record this cannot place leaves
    its event's waits judged by nothing here."""
    if not _indices(sync.event, sync.stream):
        recorded.pop(sync.event, None)
    elif holdable(sync.event):
        recorded[sync.event] = streams.point(streams.key(sync.stream))


def _waits_unnamed(name: str, sync: Any) -> bool:
    """Whether ``sync`` orders a stream, or after an event or stream, that is no index."""
    if name == "wait_stream":
        return not _indices(sync.stream, sync.waited)
    return name in ("wait_event", "sync_dealloc") and not _indices(sync.event, sync.stream)


def _judge_wait(
    name: str, sync: Any, mark: Clock | None, streams: _Streams, position: int
) -> _Wait | None:
    """The wait ``sync`` as issued (None: left out, its stream already after ``mark``, the
    point its event's record marks); its stream's order joins what it waits for. An empty
    mark: the record is not known here (a user's event, whose index may alias another, or
    one recorded before this graph), and the stream is after a point of its own."""
    stream = streams.key(sync.stream)
    waiter = streams.clock(stream)
    if mark is None:
        _join(waiter, {_Unknown(position): 1})
        return _Wait(stream, {}, optional=False)
    if name == "wait_event" and _after(mark, waiter):
        return None
    _join(waiter, mark)
    return _Wait(stream, mark, optional=name == "wait_event")


@dataclass(frozen=True)
class _Wait:
    """A wait kept by the walk in issue order: the stream it orders, the point it orders
    that stream after, and whether it may be left out (a ``sync_dealloc`` also holds its
    buffer's memory, and stays)."""

    stream: Hashable
    mark: Clock
    optional: bool


def _covered_by_a_later_wait(
    steps: list[Step], dropped: set[int], waits: dict[int, _Wait], streams: _Streams
) -> set[int]:
    """The optional waits whose point a later wait of the same stream covers, with nothing
    between them that reads that stream's order: a wait only adds to its stream's order, so
    the later one alone orders everything that follows as both did."""
    pending: dict[Hashable, list[int]] = {}  # stream -> optional waits no read has seen
    covered: set[int] = set()
    for position, step in enumerate(steps):
        if position in dropped:
            continue
        wait = waits.get(position)
        if wait is not None:
            later = pending.setdefault(wait.stream, [])
            covered.update(p for p in later if _after(waits[p].mark, wait.mark))
            later[:] = [p for p in later if p not in covered]
            if wait.optional:
                later.append(position)
            continue
        read = _read_by(step, streams)
        if read is None:
            pending.clear()
        for stream in read or ():
            pending.pop(stream, None)
    return covered


def _read_by(step: Step, streams: _Streams) -> list[Hashable] | None:
    """The streams whose order ``step`` reads (None: every stream, or it cannot say): work on a
    stream, a record on it and the host waiting for it read its order, a ``wait_stream``
    reads the order of the stream it waits for. A wait (of an event, or of a stream) only
    adds to its stream's, and the host waiting for an event reads the event."""
    if not isinstance(step, SyncCall):
        return [streams.key(step.stream)]
    name = op_name(step.op)
    sync = operands(name, step.args)
    if name in ("wait_event", "sync_dealloc", "synchronize_event") and _indices(sync.event):
        return []
    if name in ("record_event", "record_stream", "synchronize_stream") and _indices(sync.stream):
        return [streams.key(sync.stream)]
    if name == "wait_stream" and _indices(sync.waited):
        return [streams.key(sync.waited)]
    return None  # a device sync, or indices it cannot read


def _indices(*args: Any) -> bool:
    return all(type(arg) is int and arg >= 0 for arg in args)


def _event(step: SyncCall) -> Any:
    return operands(op_name(step.op), step.args).event


def _reads_event(step: SyncCall) -> bool:
    return op_name(step.op) in (
        "wait_event",
        "sync_dealloc",
        "synchronize_event",
    )


def _unread_record(step: Step, read: set[Any], holdable: Callable[[Any], bool]) -> bool:
    if not isinstance(step, SyncCall) or op_name(step.op) != "record_event":
        return False
    event = _event(step)
    return holdable(event) and event not in read


def made_by_the_package(table: UserObjectTable | None) -> Callable[[Any], bool]:
    """Whether a table index names an event the package's passes made for this graph: no
    user code records, waits, times or queries it, so ``split`` may hold its records back.
    An event a backend asked for through the public API may be read by the backend's own
    code (``Reader.CODE``): not one of them."""
    requested = (
        set()
        if table is None
        else {entry.index for entry in table.entries if entry.made_for_the_package}
    )
    return lambda index: index in requested


def the_current_stream(table: UserObjectTable | None) -> frozenset[int]:
    """The table indices that name the stream unannotated nodes run on: the current-stream
    entries, when they are all of one device (the passes and the checker read a node with
    no stream as running on its device's current stream). With two devices' current streams
    an unannotated node's is not known here: none."""
    if table is None:
        return frozenset()
    entries = [entry for entry in table.entries if entry.kind is EntryKind.CURRENT_STREAM]
    if len({entry.device for entry in entries}) != 1:
        return frozenset()
    return frozenset(entry.index for entry in entries)


def judged(table: UserObjectTable | None) -> bool:
    """Whether a graph of ``table`` may leave waits out: its unannotated work and its
    current-stream entries must be known to be one stream, or a record on an entry would
    not cover the work before it (two devices' entries)."""
    has_current = table is not None and any(
        entry.kind is EntryKind.CURRENT_STREAM for entry in table.entries
    )
    return bool(the_current_stream(table)) or not has_current


@dataclass(frozen=True)
class Judgement:
    """What ``without_redundant_waits`` needs of a graph's table, as plain data (a graph's
    meta is pickled into Inductor's FX graph cache key): its package-made events and its
    current-stream indices, each sorted."""

    package_events: tuple[int, ...]
    current: tuple[int, ...]

    def without_redundant_waits(self, steps: list[Step]) -> list[Step]:
        made = frozenset(self.package_events)
        return without_redundant_waits(steps, made.__contains__, frozenset(self.current))


def judgement(table: UserObjectTable | None) -> Judgement | None:
    """The judgement of ``table``'s graphs; None where none may leave a wait out."""
    if table is None or not judged(table):
        return None
    made = made_by_the_package(table)
    events = tuple(entry.index for entry in table.entries if made(entry.index))
    return Judgement(events, tuple(sorted(the_current_stream(table))))
