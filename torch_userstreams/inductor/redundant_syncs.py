"""Waits a program does not need: the waiting stream is already ordered after the event.

The package's passes place a sync for each value or buffer that crosses streams, one by
one: a backward's exit joins every gradient's stream back to the current stream with an
event each, although one wait for the last of them orders the others too (a stream runs its
work in order). Each sync costs the host a call per step (1-3 us on CUDA, more through
Python), so ``without_redundant_waits`` drops, from a program's steps in issue order (the
regions ``regions.split`` made, or the lines of a one-call graph's code, ``inductor.sync_lines``):

* a ``wait_event`` of a package-made event whose record the waiting stream is already
  after: it waited for a record of the same stream index at a point no earlier, itself
  or through the streams it waited for (clocks of points per stream index, in issue
  order);
* a ``wait_event`` of a package-made event that a later wait of the same stream covers
  so, with nothing but waits between them (work, a record or a ``wait_stream`` might read
  the order the first one gave): a backward's exit waits for two events recorded on one
  side stream, the second later, and only the second wait is needed;
* then the record of a package-made event nothing reads any more.

``pairs_on_one_stream`` then finds, in a backward's program, each package-made event
recorded once on one stream index and waited once (a wait or a dealloc sync) on another,
where both indices may name one stream (the user passed the current stream as a stream of
its own, as the demo's ``main`` does): when they are one stream at run time the pair orders
nothing, and the generated code skips both after comparing the two streams
(``if user_object0 != user_object2:``) instead of two calls of the accelerator's runtime.

A stream's point counts what may have added to its order: work on it, a wait that adds
something. Two indices may name one stream (``shared``: a user passes the current stream as
a side stream, or one stream twice), so work or a wait on any index that may name it counts
too: "nothing ran on index 2 between these two records" then says nothing. Two records of
one index at one point cover the same. A wait whose record is not known here (a user's
event, whose index may alias another's; one recorded before the graph) adds to its
stream's point and orders nothing this judgement relies on: it keeps its waits. A wait
this cannot read (a stream or event that is no table index) stops the judgement: every
sync stays. A host sync adds to no stream's order; it ends a covered wait's window.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from ..compile.table import EntryKind, UserObjectTable
from ..fx.control_deps import SyncCall
from ..fx.ops import op_name, operands

# A program's steps in issue order: each a sync, or work on a stream (anything else with a
# ``stream``: a ``Region``, or a line of Inductor's code, ``inductor.sync_lines``).
Step = Any

# What a stream is after: for each stream index (the current stream's entries are one key,
# None), the point of the latest record on it that this stream waited for, or made.
Clock = dict[Hashable, int]


def _join(into: Clock, other: Clock) -> None:
    for stream, point in other.items():
        if into.get(stream, -1) < point:
            into[stream] = point


@dataclass(frozen=True)
class _Record:
    """Where an event was last recorded (its stream's key and that stream's point then),
    and what that stream was after then."""

    stream: Hashable
    point: int
    after: Clock

    def covered_by(self, clock: Clock) -> bool:
        """Whether a stream after ``clock`` is after this record: after one of its stream
        index at a point no earlier."""
        return clock.get(self.stream, -1) >= self.point


@dataclass(frozen=True)
class _Wait:
    """A wait kept by the walk in issue order: the stream it orders, the record it waits
    for, and whether it may be left out (a ``sync_dealloc`` also holds its buffer's memory,
    and stays)."""

    stream: Hashable
    record: _Record
    optional: bool


class _Streams:
    """What each stream is after, as the steps are issued, and each stream's point: a count
    of what may have added to its order (work, or a wait that adds something) on its index,
    or on an index that may name the same stream (``shared``). Two records of one index at
    one point cover the same."""

    def __init__(self, current: frozenset[int], shared: frozenset[int]) -> None:
        self.current = current
        # The stream unannotated work runs on may be any of the frame's streams too.
        self.shared = frozenset(
            {self.key(index) for index in shared} | ({None} if shared else set())
        )
        self.clocks: dict[Hashable, Clock] = {}
        self.points: dict[Hashable, int] = {}

    def key(self, index: Any) -> Hashable:
        return None if index in self.current else index

    def clock(self, stream: Hashable) -> Clock:
        return self.clocks.setdefault(stream, {})

    def added_to(self, stream: Hashable, waited: _Record | None = None) -> None:
        """Something may have been added to ``stream``'s order (what ``waited`` covers, for
        a wait), and so to that of every index that may name it, unless that index is
        after ``waited`` already (it recorded it, say)."""
        named = self.shared | {stream} if stream in self.shared else {stream}
        for key in named:
            if waited is None or not waited.covered_by(self.clock(key)):
                self.points[key] = self.points.get(key, 0) + 1

    def record(self, stream: Hashable) -> _Record:
        point = self.points.get(stream, 0)
        clock = self.clock(stream)
        clock[stream] = point
        return _Record(stream, point, dict(clock))


def without_redundant_waits(
    steps: list[Step],
    holdable: Callable[[Any], bool],
    current: frozenset[int] = frozenset(),
    shared: frozenset[int] = frozenset(),
    *,
    keep_records: bool = False,
) -> list[Step]:
    """``steps`` without the redundant waits and the unread records of package-made events
    (see the module docstring); ``current`` are the indices of the current stream, the one
    unannotated regions (stream None) run on; ``shared`` the stream indices that may name
    one stream (the frame's own streams and the current stream's entries). With
    ``keep_records`` (a forward graph: its backward may wait for what it records) every
    record stays."""
    walked = _walk(steps, holdable, _Streams(current, shared))
    if walked is None:
        return list(steps)
    dropped, waits = walked
    dropped |= _covered_by_a_later_wait(steps, dropped, waits)
    kept = [step for position, step in enumerate(steps) if position not in dropped]
    if keep_records:
        return kept
    read = {_event(step) for step in kept if isinstance(step, SyncCall) and _reads_event(step)}
    return [step for step in kept if not _unread_record(step, read, holdable)]


def _walk(
    steps: list[Step], holdable: Callable[[Any], bool], streams: _Streams
) -> tuple[set[int], dict[int, _Wait]] | None:
    """The waits already covered where they are issued, and each wait kept whose event's
    record is known, in issue order; None when a stream this cannot name waits."""
    recorded: dict[Any, _Record] = {}  # package-made event -> its last record
    dropped: set[int] = set()
    waits: dict[int, _Wait] = {}
    for position, step in enumerate(steps):
        if not isinstance(step, SyncCall):
            streams.added_to(streams.key(step.stream))
            continue
        name = op_name(step.op)
        sync = operands(name, step.args)
        if _waits_unnamed(name, sync):
            return None
        if name == "record_event":
            _note_record(sync, recorded, holdable, streams)
        elif name in ("wait_event", "sync_dealloc"):
            stream = streams.key(sync.stream)
            record, waiter = recorded.get(sync.event), streams.clock(stream)
            if record is not None and record.covered_by(waiter):
                if name == "wait_event":
                    dropped.add(position)
                continue  # (a dealloc sync stays, and adds nothing)
            streams.added_to(stream, record)
            if record is None:  # a user's event, or recorded before the graph: it orders
                continue  # what this cannot say
            _join(waiter, record.after)
            waits[position] = _Wait(stream, record, name == "wait_event")
        elif name == "wait_stream":  # as a wait for a record on the other stream, here
            stream, record = streams.key(sync.stream), streams.record(streams.key(sync.waited))
            streams.added_to(stream, record)
            _join(streams.clock(stream), record.after)
    return dropped, waits


def _note_record(
    sync: Any, recorded: dict[Any, _Record], holdable: Callable[[Any], bool], streams: _Streams
) -> None:
    """A record: its stream is after it from now on; a package-made event's record is
    kept. A record this cannot place leaves its event's waits judged by nothing here."""
    if not _indices(sync.event, sync.stream):
        recorded.pop(sync.event, None)
        return
    record = streams.record(streams.key(sync.stream))
    if holdable(sync.event):
        recorded[sync.event] = record


def _waits_unnamed(name: str, sync: Any) -> bool:
    """Whether ``sync`` orders a stream, or after an event or stream, that is no index."""
    if name == "wait_stream":
        return not _indices(sync.stream, sync.waited)
    return name in ("wait_event", "sync_dealloc") and not _indices(sync.event, sync.stream)


def _covered_by_a_later_wait(
    steps: list[Step], dropped: set[int], waits: dict[int, _Wait]
) -> set[int]:
    """The optional waits that a later wait of the same stream covers, with nothing but
    waits between them: a wait only adds to its stream's order, so the later one alone
    orders everything that follows as both did."""
    pending: list[int] = []  # optional waits since the last step that is no wait
    covered: set[int] = set()
    for position, step in enumerate(steps):
        if position in dropped:
            continue
        if not _is_wait(step):
            pending.clear()
            continue
        wait = waits.get(position)
        if wait is None:
            continue  # a wait for what this cannot say: it only adds to its stream's order
        after = {**wait.record.after, wait.record.stream: wait.record.point}
        covered.update(
            p
            for p in pending
            if waits[p].stream == wait.stream and waits[p].record.covered_by(after)
        )
        pending[:] = [p for p in pending if p not in covered]
        if wait.optional:
            pending.append(position)
    return covered


def _is_wait(step: Step) -> bool:
    return isinstance(step, SyncCall) and op_name(step.op) in ("wait_event", "sync_dealloc")


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


# The two stream indices of a record and its one wait: when they name one stream at run
# time, neither sync orders anything.
Guard = tuple[int, int]


def pairs_on_one_stream(
    steps: list[Step], holdable: Callable[[Any], bool], shared: frozenset[int]
) -> dict[int, Guard]:
    """The positions in ``steps`` of each package-made event's record and its one wait where
    the two are on different stream indices that may name one stream (both in ``shared``),
    each with the pair's two indices. The event is named by no other step, and recorded
    before it is waited, so with the two indices one stream the wait is after the record on
    that stream already: both can be skipped, and nothing else reads the event. A dealloc
    sync's wait too: a buffer freed on the stream that last used it is reused after that
    use, in that stream's order."""
    named: dict[Any, list[int]] = {}
    for position, step in enumerate(steps):
        if isinstance(step, SyncCall):
            event = _event(step)
            if event is not None and holdable(event):
                named.setdefault(event, []).append(position)
    guards: dict[int, Guard] = {}
    for positions in named.values():
        if len(positions) != 2:
            continue
        first, then = (steps[position] for position in positions)
        if op_name(first.op) != "record_event" or not _is_wait(then):
            continue
        recorded_on, waits = _event_stream(first), _event_stream(then)
        if _indices(recorded_on, waits) and recorded_on != waits and {recorded_on, waits} <= shared:
            guards[positions[0]] = guards[positions[1]] = (recorded_on, waits)
    return guards


def _event_stream(step: SyncCall) -> Any:
    return operands(op_name(step.op), step.args).stream


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
    meta is pickled into Inductor's FX graph cache key): its package-made events, its
    current-stream indices and the stream indices that may name one stream, each sorted."""

    package_events: tuple[int, ...]
    current: tuple[int, ...]
    shared: tuple[int, ...]
    keep_records: bool  # a forward graph's: its backward may wait for what it records

    def without_redundant_waits(self, steps: list[Step]) -> list[Step]:
        made = frozenset(self.package_events)
        current, shared = frozenset(self.current), frozenset(self.shared)
        return without_redundant_waits(
            steps, made.__contains__, current, shared, keep_records=self.keep_records
        )

    def pairs_on_one_stream(self, steps: list[Step]) -> dict[int, Guard]:
        """``pairs_on_one_stream`` of a backward's ``steps``; none in a forward, whose
        backward may wait for what it records."""
        if self.keep_records:
            return {}
        made = frozenset(self.package_events)
        return pairs_on_one_stream(steps, made.__contains__, frozenset(self.shared))


def judgement(table: UserObjectTable | None, *, backward: bool) -> Judgement | None:
    """The judgement of ``table``'s forward or backward graph; None where none may leave a
    wait out."""
    if table is None or not judged(table):
        return None
    made = made_by_the_package(table)
    events = tuple(entry.index for entry in table.entries if made(entry.index))
    current = tuple(sorted(the_current_stream(table)))
    return Judgement(events, current, may_name_one(table), keep_records=not backward)


def may_name_one(table: UserObjectTable | None) -> tuple[int, ...]:
    """The stream indices of ``table`` that may name one stream: the frame's own (inputs,
    globals, attributes) and the current stream's entries. A stream the function makes,
    or one a pass asked for, is new each call: no other index names it."""
    kinds = (EntryKind.INPUT, EntryKind.CURRENT_STREAM)
    return tuple(
        entry.index
        for entry in (table.entries if table is not None else ())
        if entry.kind in kinds and "Stream" in entry.example_type
    )
