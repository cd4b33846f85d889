"""CUDA's stream-capture rules, checked on a forward or backward graph when it compiles.

``mode="reduce-overhead"`` captures a graph as a CUDA graph: the current stream (the one
Inductor's CUDA-graph trees capture on) records the work, and every other stream the graph
uses must join that capture and leave it the way CUDA allows. A graph that breaks a rule
fails to capture with a CUDA error, or, worse, replays without the work or the order the
user wrote. The rules, as this module reads them off the graph (``testing.graph_view`` for
the kernels and syncs in issue order, ``testing.happens_before`` for the ordering):

a. **forked**: a side stream's work must come after a sync from a stream already capturing
   (directly or through other syncs, from the current stream); else it runs outside the
   capture. A capturing stream waiting on an event recorded on such a stream is an error
   too (the record was not captured).
b. **joined**: the current stream must wait for each side stream's last captured work (a
   wait that forked it counts) before the graph returns ("capturing stream has unjoined
   work" otherwise).
c. **no host sync**: ``synchronize()`` of an event, stream or device, or ``query()``,
   inside a capture invalidates it.
d. **events stay inside**: a captured record is not replayed as a record a later wait
   outside the graph could see, and a captured wait on an event recorded outside the capture
   is an error. So an event the graph records must be created by the graph or waited on
   inside it after the record, and an event it waits on must be recorded inside it first.

Unannotated nodes run on the current stream, and so does host work. ``synchronize_*`` does
not order anything here (the host cannot block inside a graph): it is reported instead.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch.fx

from ..compile.table import EntryKind, UserObjectTable
from ..fx.control_deps import sync_node
from ..fx.meta import records, user_frame
from ..fx.ops import operands

if TYPE_CHECKING:
    from ..testing.graph_view import Kernel, Sync

CURRENT = "current"  # the stream the capture runs on: every current-stream index, and None
HOST_SYNCS = frozenset({"synchronize_event", "synchronize_stream", "synchronize_device"})
WAITS = frozenset({"wait_event", "sync_dealloc"})


class Rule(enum.Enum):
    """The capture rule a violation breaks (see the module docstring)."""

    NOT_FORKED = "a: side stream not forked from the capture"
    NOT_JOINED = "b: side stream not joined back"
    HOST_SYNC = "c: host sync inside the capture"
    OUTSIDE_EVENT = "d: event crosses the graph's boundary"


@dataclass(frozen=True)
class Violation:
    """One broken rule: which stream or event, where in the graph, and how to fix it."""

    rule: Rule
    subject: str  # "stream L['side']", "event L['done']"
    problem: str
    node: str  # the graph node where it shows
    line: str | None  # the user's line (or the pass) that made the node, when known
    fix: str

    def __str__(self) -> str:
        at = f"node {self.node}" + (f", {self.line}" if self.line else "")
        return f"[{self.rule.value}] {self.subject}: {self.problem} ({at}); fix: {self.fix}"


def capture_violations(gm: torch.fx.GraphModule, table: UserObjectTable | None) -> list[Violation]:
    """Every capture rule ``gm`` breaks, in graph order (the end-of-graph ones last)."""
    # Lazy: ``testing`` sits above ``backends`` (the one upward import, see internals.md).
    from ..testing.graph_view import Kernel, read_graph

    current_streams = table.current_streams() if table is not None else {}
    devices = {} if table is None else {e.index: str(e.device) for e in table.entries if e.device}
    state = _Capture(gm, table, frozenset(current_streams.values()))
    for step in read_graph(gm, current_streams, devices).steps:
        if isinstance(step, Kernel):
            state.kernel(step)
        else:
            state.sync(step)
    state.end()
    return state.found


def describe(violations: Iterable[Violation]) -> str:
    """One violation a line, numbered."""
    return "\n".join(f"  {i}. {v}" for i, v in enumerate(violations, 1))


class _Capture:
    """The rules applied one step at a time, in issue order."""

    def __init__(
        self, gm: torch.fx.GraphModule, table: UserObjectTable | None, current: frozenset[int]
    ) -> None:
        from ..testing.happens_before import StreamClocks

        self.gm, self.table, self.current = gm, table, current
        self.clocks = StreamClocks()
        self.clocks.issue(CURRENT)  # the graph's start: tick 1 of the current stream
        self.last: dict[Hashable, tuple[int, torch.fx.Node]] = {}  # side stream's last capture
        self.unforked: set[Hashable] = set()
        self.recorded: dict[Hashable, torch.fx.Node] = {}  # event -> its last record
        self.off_capture: dict[Hashable, tuple[Hashable, torch.fx.Node]] = {}
        self.waited: set[Hashable] = set()  # events waited on since their last record
        self.outside_waits: set[Hashable] = set()
        self.found: list[Violation] = []

    # -- streams ----------------------------------------------------------------------

    def key(self, stream: Any) -> Hashable:
        return CURRENT if stream is None or stream in self.current else stream

    def capturing(self, stream: Hashable) -> bool:
        return stream == CURRENT or self.clocks.now(stream).get(CURRENT, 0) >= 1

    def extend(self, stream: Hashable, node: torch.fx.Node) -> None:
        """A captured step on a side stream: the current stream must wait for it."""
        if stream != CURRENT and self.capturing(stream):
            tick = self.clocks.issue(stream)[stream]
            self.last[stream] = (tick, node)

    def kernel(self, kernel: Kernel) -> None:
        stream = self.key(kernel.stream)
        if not self.capturing(stream):
            self.not_forked(stream, kernel.node, "its work runs outside the capture")
            self.clocks.issue(stream)
            return
        if stream == CURRENT:
            self.clocks.issue(stream)
        else:
            self.extend(stream, kernel.node)

    # -- syncs ------------------------------------------------------------------------

    def sync(self, sync: Sync) -> None:
        name, args = sync.name, operands(sync.name, sync.args)
        if name in HOST_SYNCS or "query" in name:
            self.host_sync(sync)
        elif name == "record_event":
            self.record(args.event, self.key(args.stream), sync.node)
        elif name in WAITS:
            self.wait_event(args.event, self.key(args.stream), sync.node)
        elif name == "wait_stream":
            self.wait_stream(self.key(args.stream), self.key(args.waited), sync.node)
        # fork / join / record_stream order nothing

    def record(self, event: Hashable, stream: Hashable, node: torch.fx.Node) -> None:
        self.recorded[event] = node
        self.waited.discard(event)
        if self.capturing(stream):
            self.off_capture.pop(event, None)
        else:
            self.off_capture[event] = (stream, node)
        self.clocks.record(event, stream)

    def wait_event(self, event: Hashable, stream: Hashable, node: torch.fx.Node) -> None:
        if event not in self.recorded:
            self.waited_not_recorded(event, node)
            return  # orders nothing: its record is outside the graph
        self.waited.add(event)
        if self.capturing(stream) and event in self.off_capture:
            source, record = self.off_capture[event]
            self.not_forked(source, record, "a capturing stream waits on an event it recorded")
        self.clocks.wait_event(event, stream)
        self.extend(stream, node)

    def wait_stream(self, waiting: Hashable, waited_on: Hashable, node: torch.fx.Node) -> None:
        if self.capturing(waiting) and not self.capturing(waited_on):
            self.not_forked(waited_on, node, "a capturing stream waits on it")
        self.clocks.wait_stream(waiting, waited_on)
        self.extend(waiting, node)

    def end(self) -> None:
        """What must hold when the graph returns: joins, and no record left for outside."""
        joined = self.clocks.now(CURRENT)
        for stream, (tick, node) in self.last.items():
            if stream not in self.unforked and joined.get(stream, 0) < tick:
                self.not_joined(stream, node)
        for event, node in self.recorded.items():
            if event not in self.waited and not self.created_here(event):
                self.recorded_not_waited(event, node)

    # -- reports ----------------------------------------------------------------------

    def not_forked(self, stream: Hashable, node: torch.fx.Node, problem: str) -> None:
        if stream in self.unforked:
            return
        self.unforked.add(stream)
        self.report(
            Rule.NOT_FORKED,
            f"stream {self.name(stream)}",
            f"not forked from the capture (it waits for no sync from the current stream "
            f"before this): {problem}",
            node,
            "make it wait for the current stream before its first work "
            "(`stream.wait_stream(torch.cuda.current_stream())`, or an event recorded on the "
            "current stream and waited on it)",
        )

    def not_joined(self, stream: Hashable, node: torch.fx.Node) -> None:
        self.report(
            Rule.NOT_JOINED,
            f"stream {self.name(stream)}",
            "the current stream does not wait for its work up to here before the graph "
            "returns (CUDA: capturing stream has unjoined work)",
            node,
            "make the current stream wait for it after its last work "
            "(`torch.cuda.current_stream().wait_stream(stream)`) before returning",
        )

    def host_sync(self, sync: Sync) -> None:
        objects = () if sync.name == "synchronize_device" else sync.args  # a device index
        named = ", ".join(self.name(arg) for arg in objects if type(arg) is int)
        self.report(
            Rule.HOST_SYNC,
            f"{sync.name}({named})",
            "the host cannot block on (or query) captured work: the capture is invalidated",
            sync.node,
            "remove it from the compiled function, and order the streams with wait_stream "
            "or an event's wait instead",
        )

    def waited_not_recorded(self, event: Hashable, node: torch.fx.Node) -> None:
        if event in self.outside_waits:
            return
        self.outside_waits.add(event)
        self.report(
            Rule.OUTSIDE_EVENT,
            f"event {self.name(event)}",
            "waited on inside the graph but recorded outside it (a captured wait needs a "
            "record in the same capture)",
            node,
            "record it inside the compiled function before the wait, or wait on it before "
            "calling the compiled function",
        )

    def recorded_not_waited(self, event: Hashable, node: torch.fx.Node) -> None:
        self.report(
            Rule.OUTSIDE_EVENT,
            f"event {self.name(event)}",
            "recorded inside the graph and not waited on inside it: a replayed graph does "
            "not record it, so a wait or query after the call would see a stale record",
            node,
            "wait on it inside the compiled function, or record it after the call returns",
        )

    def report(self, rule: Rule, subject: str, problem: str, node: torch.fx.Node, fix: str) -> None:
        self.found.append(Violation(rule, subject, problem, node.name, self.line(node), fix))

    # -- names ------------------------------------------------------------------------

    def name(self, index: Hashable) -> str:
        """The table entry's origin (``L['side']``); the kind of object when made by a pass."""
        if index == CURRENT:
            return "the current stream"
        entries = self.table.entries if self.table is not None else []
        if not isinstance(index, int) or not 0 <= index < len(entries):
            return f"user object {index}"
        entry = entries[index]
        if entry.kind is EntryKind.REQUESTED:
            return f"{entry.origin} (made by {entry.added_by})"
        return entry.origin

    def created_here(self, event: Hashable) -> bool:
        """Whether the event is made fresh each call for this graph (by the function, or by
        a pass) and no code outside the graph holds it: nothing outside waits on it."""
        entries = self.table.entries if self.table is not None else []
        if not (isinstance(event, int) and 0 <= event < len(entries)):
            return False
        entry = entries[event]
        return entry.kind is EntryKind.GRAPH_CREATED or entry.made_for_the_package

    def line(self, node: torch.fx.Node) -> str | None:
        """The user's line that made ``node`` (a sync inside a ``control_deps`` keeps it);
        else the pass that added it."""
        for candidate in (node, sync_node(self.gm, node)):
            frame = None if candidate is None else user_frame(candidate)
            if frame is not None:
                where, code = frame
                return f"{where}: {code}" if code else where
        notes = records(node)
        return f"added by {notes[0]}" if notes else None
