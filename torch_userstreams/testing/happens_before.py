"""Happens-before between the kernels of a graph, as vector clocks.

Rules:

* Program order: kernels on one stream run in the order they are issued (graph order).
* ``record_event(e, S)`` snapshots everything issued on S so far; ``wait_event(e, T)`` and
  ``sync_dealloc(e, T, _)`` make all later work on T wait for that snapshot. Waiting on an
  event the graph never recorded orders nothing (on CUDA such a wait is a no-op), and a
  record replaces the event's previous snapshot.
* ``wait_stream(T, S)``: all later work on T waits for everything issued on S so far.
* ``synchronize_event`` / ``synchronize_stream`` / ``synchronize_device``: the host blocks,
  so everything issued later, on every stream, comes after the synchronized work
  (``synchronize_device`` covers every stream: the table does not say which is on which
  device).
* Stream switches need no node: each kernel carries its stream. ``fork``/``join`` order nothing.
* Inputs exist before the graph starts, so they happen-before every kernel.

Kernel ``a`` happens-before kernel ``b`` when ``b``'s clock has seen ``a``'s tick on ``a``'s
stream: the usual vector-clock test, exact for this model. ``StreamClocks`` applies the
rules one step at a time (the program generator uses it too); ``HappensBefore`` runs it
over a graph.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .graph_view import Kernel, StreamKey, Sync

Clock = dict[Hashable, int]


def _join(into: Clock, other: Clock) -> None:
    for stream, tick in other.items():
        if into.get(stream, 0) < tick:
            into[stream] = tick


class StreamClocks:
    """The rules above, applied one issued kernel or sync at a time."""

    def __init__(self) -> None:
        self.streams: dict[Hashable, Clock] = {}
        self.events: dict[Hashable, Clock] = {}
        self.host: Clock = {}

    def now(self, stream: Hashable) -> Clock:
        """What work issued next on ``stream`` will wait for (a live view: copy to keep)."""
        clock = self.streams.setdefault(stream, {})
        _join(clock, self.host)
        return clock

    def issue(self, stream: Hashable) -> Clock:
        """Issue one kernel on ``stream``; returns its clock."""
        clock = self.now(stream)
        clock[stream] = clock.get(stream, 0) + 1
        return dict(clock)

    def seen_by(self, stream: Hashable, tick_stream: Hashable, tick: int) -> bool:
        """Whether the next work on ``stream`` waits for ``tick`` of ``tick_stream``."""
        return stream == tick_stream or self.now(stream).get(tick_stream, 0) >= tick

    def record(self, event: Hashable, stream: Hashable) -> None:
        self.events[event] = dict(self.now(stream))

    def wait_event(self, event: Hashable, stream: Hashable) -> None:
        snapshot = self.events.get(event)
        if snapshot is not None:
            _join(self.now(stream), snapshot)

    def wait_stream(self, waiting: Hashable, waited_on: Hashable) -> None:
        _join(self.now(waiting), dict(self.now(waited_on)))

    def synchronize_event(self, event: Hashable) -> None:
        _join(self.host, self.events.get(event, {}))

    def synchronize_stream(self, stream: Hashable) -> None:
        _join(self.host, dict(self.now(stream)))

    def synchronize_all(self) -> None:
        for stream in list(self.streams):
            self.synchronize_stream(stream)

    def apply(self, sync: Sync) -> None:
        """Apply one ``streams::*`` op of a graph (by name: older torch lacks some ops)."""
        args = sync.args
        handlers = {
            "record_event": lambda: self.record(args[0], args[1]),
            "wait_event": lambda: self.wait_event(args[0], args[1]),
            "sync_dealloc": lambda: self.wait_event(args[0], args[1]),
            "wait_stream": lambda: self.wait_stream(args[0], args[1]),
            "synchronize_event": lambda: self.synchronize_event(args[0]),
            "synchronize_stream": lambda: self.synchronize_stream(args[0]),
            "synchronize_device": self.synchronize_all,
        }
        handler = handlers.get(sync.name)
        if handler is not None:  # fork/join/record_stream order nothing
            handler()


class HappensBefore:
    """The happens-before relation of the steps of one graph (see the module docstring)."""

    def __init__(self, steps: Sequence[Kernel | Sync]) -> None:
        self.clocks: dict[Kernel, Clock] = {}
        state = self._state = StreamClocks()
        for step in steps:
            if isinstance(step, Kernel):
                self.clocks[step] = state.issue(step.stream)
            else:
                state.apply(step)

    def ordered(self, first: Kernel, second: Kernel) -> bool:
        """Whether ``first`` finishes before ``second`` starts, whatever the timing."""
        tick = self.clocks[first].get(first.stream, 0)
        return tick <= self.clocks[second].get(first.stream, 0)

    def ordered_before_end(self, first: Kernel, stream: StreamKey) -> bool:
        """Whether work issued on ``stream`` after the graph returns waits for ``first``."""
        tick = self.clocks[first].get(first.stream, 0)
        return self._state.seen_by(stream, first.stream, tick)
