"""The stream schedule of one training step on any device, read from its FX graphs.

Compiles the model through AOTAutograd with the package installed (the graphs the
``userstreams_aot_eager`` backend executes, after the package's passes), runs one step, and
lays the nodes of the forward and backward graphs out in program order: one lane per stream
(a table index), a box per op, markers for ``streams::*`` syncs and an arrow from each
event's record to its waits.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

from .. import installed
from ..passes.annotations import stream_of
from ..registration import collecting_tables
from ..runtime import lookup
from ..stream_executor import compile_with_streams
from ..stream_ops import is_sync_op, op_name
from ..table import EntryKind, UserObjectTable
from .config import DemoConfig
from .model import build_model, make_batches
from .timeline import KERNEL, RECORD, SYNC, WAIT, Arrow, Box, Section, Timeline

Graphs = list[tuple[str, torch.fx.GraphModule]]
SECTION_GAP = 2
_LANE_KINDS = {EntryKind.CURRENT_STREAM: "current stream", EntryKind.INPUT: "input"}


def capture_step(config: DemoConfig) -> tuple[Graphs, list[UserObjectTable]]:
    """The forward and backward graphs of one compiled training step, and their tables."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch import config as functorch_config

    forward: list[torch.fx.GraphModule] = []
    backward: list[torch.fx.GraphModule] = []

    def recording(into: list[torch.fx.GraphModule]) -> Callable[..., Any]:
        def compiler(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
            into.append(gm)
            return compile_with_streams(gm, example_inputs)

        return compiler

    backend = aot_autograd(fw_compiler=recording(forward), bw_compiler=recording(backward))
    model = build_model(config.dim, config.blocks, config.device, config.seed)
    x, y = make_batches(1, config.batch, config.dim, config.device, config.seed)[0]
    torch._dynamo.reset()
    try:
        # A cache hit would skip the compilers, and so the recording.
        with (
            installed(),
            functorch_config.patch(enable_autograd_cache=False),
            collecting_tables() as tables,
        ):
            F.mse_loss(torch.compile(model, backend=backend)(x), y).backward()
    finally:
        torch._dynamo.reset()
    graphs = [(f"forward {i}", gm) for i, gm in enumerate(forward)]
    graphs += [(f"backward {i}", gm) for i, gm in enumerate(backward)]
    return graphs, list(tables)


def _streams_op(node: torch.fx.Node) -> tuple[str, tuple] | None:
    if is_sync_op(node.target):
        return op_name(node.target), node.args
    return None


def _sync_call(gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[str, tuple] | None:
    """(op name, args) of the ``streams::*`` op ``node`` issues, directly or via control_deps.

    Dynamo wraps a sync that orders other work in ``control_deps(deps, subgraph, ...)``: the
    op itself is the one ``streams::*`` node of the subgraph module.
    """
    if getattr(node.target, "_name", None) != "control_deps":
        return _streams_op(node)
    subgraph = node.args[1]
    module = (
        getattr(gm, str(subgraph.target), None) if isinstance(subgraph, torch.fx.Node) else None
    )
    if not isinstance(module, torch.fx.GraphModule):
        return None
    return next(filter(None, map(_streams_op, module.graph.nodes)), None)


def _issues_work(node: torch.fx.Node) -> bool:
    """False for what runs on the host only: getitem, the package's lookups, non-calls."""
    return node.op == "call_function" and node.target not in (operator.getitem, lookup)


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
