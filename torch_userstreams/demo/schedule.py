"""The stream schedule of one training step on any device, read from its FX graphs.

Compiles the model through AOTAutograd with the package installed (the graphs the
``userstreams_aot_eager`` backend executes, after the package's passes), runs one step, and
lays the nodes of the forward and backward graphs out in program order: one lane per stream
(a table index), a box per op, markers for ``streams::*`` syncs and an arrow from each
event's record to its waits.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from ..compile.table import EntryKind, UserObjectTable
from ..fx.control_deps import sync_of
from ..fx.meta import stream_of
from ..fx.ops import is_lookup, op_name
from ..testing.capture import capture
from .config import DemoConfig
from .model import ForwardAndLoss, build_model, make_batches
from .timeline import KERNEL, RECORD, SYNC, WAIT, Arrow, Box, Section, Timeline

Graphs = list[tuple[str, torch.fx.GraphModule]]
SECTION_GAP = 2
_LANE_KINDS = {EntryKind.CURRENT_STREAM: "current stream", EntryKind.INPUT: "input"}


def capture_step(config: DemoConfig) -> tuple[Graphs, list[UserObjectTable]]:
    """The forward and backward graphs of one compiled training step, and their tables."""
    model = build_model(config.dim, config.blocks, config.device, config.seed)
    x, y = make_batches(1, config.batch, config.dim, config.device, config.seed)[0]
    try:
        captured = capture(ForwardAndLoss(model), x, y)
    finally:
        torch._dynamo.reset()
    return captured.graphs, captured.tables


def _sync_call(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[str, tuple] | None:
    """(op name, args) of the sync op ``node`` issues, directly or via control_deps."""
    sync = sync_of(gm, node)
    return None if sync is None else (op_name(sync.op), sync.args)


def _issues_work(node: torch.fx.Node) -> bool:
    """False for what runs on the host only: getitem, the package's lookups, non-calls."""
    return (
        node.op == "call_function"
        and node.target is not operator.getitem
        and not is_lookup(node.target)
    )


def _op_label(node: torch.fx.Node) -> str:
    target = node.target
    name = getattr(target, "_opname", None) or getattr(target, "__name__", None) or str(target)
    return f"{name} ({node.name})"


class _Layout:
    """Lays graphs out on one Timeline, remembering each event's last record for arrows."""

    def __init__(self, table: UserObjectTable | None) -> None:
        self.table = table
        self.timeline = Timeline(
            title="one training step: stream schedule of the compiled graphs",
            unit="position in program order",
        )
        self.position = 0
        self.records: dict[int, tuple[str, float]] = {}
        self.current = self._current_index()

    def _current_index(self) -> int | None:
        for entry in self.table.entries if self.table else ():
            if entry.kind is EntryKind.CURRENT_STREAM:
                return entry.index
        return None

    def lane(self, index: Any) -> str:
        if not isinstance(index, int):
            index = self.current
        if index is None:
            return self.timeline.lane("current stream")
        entries = self.table.entries if self.table else []
        kind = entries[index].kind if index < len(entries) else None
        what = "input" if kind is None else _LANE_KINDS.get(kind, kind.value)
        return self.timeline.lane(f"stream {index} ({what})")

    def add_graph(self, title: str, gm: torch.fx.GraphModule) -> None:
        start = self.position
        for node in filter(_issues_work, gm.graph.nodes):
            sync = _sync_call(gm, node)
            if sync is None:
                self._box(self.lane(stream_of(node)), _op_label(node), KERNEL)
            else:
                self._sync(*sync)
        self.timeline.sections.append(Section(title, start, self.position))
        self.position += SECTION_GAP

    def _box(self, lane: str, label: str, kind: str) -> None:
        self.timeline.boxes.append(Box(lane, self.position, 1.0, label, kind))
        self.position += 1

    def _sync(self, op: str, args: tuple) -> None:
        if op == "record_event":
            lane = self.lane(args[1])
            self.records[args[0]] = (lane, self.position)
            self._box(lane, f"record event {args[0]}", RECORD)
        elif op in ("wait_event", "sync_dealloc"):
            lane = self.lane(args[1])
            source = self.records.get(args[0])
            if source is not None:
                self.timeline.arrows.append(
                    Arrow(source[0], source[1], lane, self.position, f"event {args[0]}")
                )
            self._box(lane, f"{op} event {args[0]}", WAIT)
        elif op == "wait_stream":
            waiting, waited = self.lane(args[0]), self.lane(args[1])
            self.timeline.arrows.append(Arrow(waited, self.position, waiting, self.position))
            self._box(waiting, "wait_stream", WAIT)
        else:
            self._box(self.lane(args[1] if len(args) > 1 else None), op, SYNC)


def schedule_timeline(graphs: Graphs, tables: list[UserObjectTable]) -> Timeline:
    """Lay out ``graphs`` (forward first) with lanes named from the first graph's table."""
    layout = _Layout(tables[0] if tables else None)
    for title, gm in graphs:
        layout.add_graph(title, gm)
    return layout.timeline


def schedule_step(config: DemoConfig) -> Timeline:
    """Capture one step and lay it out."""
    return schedule_timeline(*capture_step(config))
