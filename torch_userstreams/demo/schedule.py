"""The stream schedule of one training step on any device, read from its FX graphs.

Compiles the model with the demo's backend and the package installed, runs one step, and
lays out what the compiled program of each forward and backward graph issues, in that order
(``issued``): one lane per stream, named as the user's code names it (``names``), a box per
op, a marker per sync (hollow where the backend leaves it out) and an arrow from each
event's record to its waits. x is that order, not time: the caption says so.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from ..compile.table import EntryKind, UserObjectTable
from ..fx.control_deps import SyncCall
from ..fx.ops import op_name, operands
from ..testing.capture import capture
from .config import DemoConfig
from .issued import Issued, issued_steps, syncs_caption
from .model import ForwardAndLoss, build_model, make_batches
from .names import CURRENT, entry_names
from .timeline import KERNEL, RECORD, SYNC, WAIT, Arrow, Box, Section, Timeline

Graphs = list[tuple[str, torch.fx.GraphModule]]
SECTION_GAP = 2
X_CAPTION = (
    "x: the order the compiled program issues its work, one step per op or sync of the "
    "graphs the backend compiles (positions, not time)"
)
FUSED = "; Inductor may fuse neighbouring ops into one kernel"
LANES_CAPTION = (
    "lanes: the streams as the code names them (module path and variable); 'current' is "
    "the device's current stream"
)


def capture_step(config: DemoConfig) -> tuple[Graphs, list[UserObjectTable]]:
    """The forward and backward graphs of one compiled training step, and their tables."""
    model = build_model(config.dim, config.blocks, config.device, config.seed)
    x, y = make_batches(1, config.batch, config.dim, config.device, config.seed)[0]
    try:
        captured = capture(ForwardAndLoss(model), x, y, backend=config.backend)
    finally:
        torch._dynamo.reset()
    return captured.graphs, captured.tables


def _op_label(node: torch.fx.Node) -> str:
    target = node.target
    return getattr(target, "_opname", None) or getattr(target, "__name__", None) or str(target)


class _Layout:
    """Lays graphs out on one Timeline, remembering each event's last record for arrows."""

    def __init__(self, table: UserObjectTable | None, names: dict[int, str]) -> None:
        self.table = table
        self.names = names
        self.timeline = Timeline(
            title="one training step: what the compiled graphs issue, per stream",
            unit="position in issue order (not time)",
        )
        self.position = 0
        self.records: dict[int, tuple[str, float]] = {}
        entries = table.entries if table is not None else []
        current = [e.index for e in entries if e.kind is EntryKind.CURRENT_STREAM]
        self.current = current[0] if len(current) == 1 else None

    def name(self, index: Any, what: str) -> str:
        """The user's name for ``index``, else the index and what it is."""
        if not isinstance(index, int):
            return str(index)
        return self.names.get(index) or f"{what} {index}"

    def lane(self, index: Any) -> str:
        """The lane of stream ``index``; None (no annotation) is the current stream's."""
        if index is None and self.current is not None:
            index = self.current
        if index is None:
            return self.timeline.lane(CURRENT)
        return self.timeline.lane(self.name(index, "stream"))

    def add_graph(self, title: str, steps: list[Issued]) -> None:
        start = self.position
        for step in steps:
            if step.sync is None:
                lane = self.lane(step.stream)
                detail = f"{step.node.target} ({step.node.name}) on {lane}"
                self._box(Box(lane, self.position, 1.0, _op_label(step.node), KERNEL, detail))
            else:
                self._sync(step.sync, step.issued)
        self.timeline.sections.append(Section(title, start, self.position))
        self.position += SECTION_GAP

    def _box(self, box: Box) -> None:
        self.timeline.boxes.append(box)
        self.position += 1

    def _sync(self, sync: SyncCall, issued: bool) -> None:
        op = op_name(sync.op)
        args = operands(op, sync.args)
        if op in ("record_event", "wait_event", "sync_dealloc") and len(sync.args) > 1:
            self._event_sync(op, args.event, self.lane(args.stream), issued)
        elif op == "wait_stream" and len(sync.args) > 1:
            waiting, waited = self.lane(args.stream), self.lane(args.waited)
            if issued:
                self.timeline.arrows.append(
                    Arrow(waited, self.position, waiting, self.position, f"{waiting} waits")
                )
            detail = f"wait_stream: {waiting} waits for {waited}"
            self._box(Box(waiting, self.position, 1.0, waited, WAIT, _not(detail, issued), issued))
        else:
            lane = self.lane(args.stream)
            self._box(Box(lane, self.position, 1.0, op, SYNC, _not(op, issued), issued))

    def _event_sync(self, op: str, event: Any, lane: str, issued: bool) -> None:
        name = self.name(event, "event")
        detail = _not(f"{op} {name} on {lane}", issued)
        label = name.rsplit(".", 1)[-1]
        if op == "record_event":
            if issued:
                self.records[event] = (lane, self.position)
            self._box(Box(lane, self.position, 1.0, label, RECORD, detail, issued))
            return
        source = self.records.get(event)
        if source is not None and issued:
            self.timeline.arrows.append(Arrow(source[0], source[1], lane, self.position, name))
        self._box(Box(lane, self.position, 1.0, label, WAIT, detail, issued))


def _not(detail: str, issued: bool) -> str:
    return detail if issued else f"not issued (left out by the backend): {detail}"


def schedule_timeline(
    graphs: Graphs, tables: list[UserObjectTable], backend: str = "userstreams_aot_eager"
) -> Timeline:
    """Lay out what ``backend`` issues for ``graphs`` (forward first), lanes named from the
    first graph's table and the user's code."""
    table = tables[0] if tables else None
    layout = _Layout(table, entry_names(table, graphs))
    for title, gm in graphs:
        layout.add_graph(title, issued_steps(gm, table, backend))
    timeline = layout.timeline
    timeline.caption = [
        X_CAPTION + (FUSED if backend == "userstreams" else ""),
        syncs_caption(backend, table, timeline.left_out()),
        LANES_CAPTION,
    ]
    return timeline


def schedule_step(config: DemoConfig) -> Timeline:
    """Capture one step with the demo's backend and lay it out."""
    graphs, tables = capture_step(config)
    return schedule_timeline(graphs, tables, config.backend)
