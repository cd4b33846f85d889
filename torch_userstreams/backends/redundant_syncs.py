"""Waits a program does not need: the waiting stream is already ordered after the event.

The package's passes place a sync for each value or buffer that crosses streams, one by
one: a backward's exit joins every gradient's stream back to the current stream with an
event each, although one wait for the last of them orders the others too (a stream runs its
work in order). Each sync costs the host a call per step (1-3 us on CUDA, more through
Python), so ``without_redundant_waits`` drops, from the steps ``regions.split`` made:

* a ``wait_event`` of a package-made event whose record the waiting stream already comes
  after: through its own order, or through the waits it issued before (vector clocks over
  the program's streams, in issue order);
* then the record of a package-made event nothing reads any more.

Only package-made events (``holdable``) are judged: each is an object no other index names,
recorded and waited only where the passes put it. A user's event may be timed, queried or
passed twice; its syncs stay. Unknown orderings (an event recorded before the graph, a host
synchronize) only make the judgement keep more.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from ..fx.control_deps import SyncCall
from ..fx.ops import op_name, operands
from .regions import Region, Step

Clock = dict[Hashable, int]


def _after(earlier: Clock, later: Clock) -> bool:
    """Whether every point of ``earlier`` is covered by ``later``."""
    return all(later.get(stream, 0) >= point for stream, point in earlier.items())


def _join(into: Clock, other: Clock) -> None:
    for stream, point in other.items():
        if into.get(stream, 0) < point:
            into[stream] = point


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
    recorded: dict[Any, Clock] = {}  # event -> the point its last record marks
    dropped: set[int] = set()
    for position, step in enumerate(steps):
        if isinstance(step, Region):
            streams.work(streams.key(step.stream))
            continue
        name = op_name(step.op)
        sync = operands(name, step.args)
        if name == "record_event" and holdable(sync.event):
            if _indices(sync.event, sync.stream):
                recorded[sync.event] = streams.point(streams.key(sync.stream))
            else:  # recorded where this cannot say: its waits are judged by nothing here
                recorded.pop(sync.event, None)
        elif name in ("wait_event", "sync_dealloc") and _indices(sync.event, sync.stream):
            waiter = streams.clock(streams.key(sync.stream))
            mark = recorded.get(sync.event)
            if mark is None:  # a user's event (its index may alias another), or recorded
                continue  # before this graph: what it orders is not known here
            if name == "wait_event" and _after(mark, waiter):
                dropped.add(position)
            else:
                _join(waiter, mark)
        elif name == "wait_stream" and _indices(sync.stream, sync.waited):
            _join(streams.clock(streams.key(sync.stream)), streams.point(streams.key(sync.waited)))
        # A host sync or a record_stream orders nothing this judgement relies on.
    kept = [step for position, step in enumerate(steps) if position not in dropped]
    read = {_event(step) for step in kept if isinstance(step, SyncCall) and _reads_event(step)}
    return [step for step in kept if not _unread_record(step, read, holdable)]


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
