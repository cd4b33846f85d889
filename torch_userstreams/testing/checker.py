"""``check_stream_safety``: every cross-stream hazard of an FX graph, with the sync to fix it.

The rules live where they are applied: how a graph reads as kernels and syncs in
``graph_view``, the happens-before relation in ``happens_before``, what a hazard is in
``hazards``. This module runs them and reports.

Which index is the current stream: unannotated nodes run on the current stream, which the
package's passes name by a table index. Pass ``current_streams`` ({device: index}), or let
the checker read it from ``gm.meta[CURRENT_STREAMS_META]`` (``capture`` sets it from the
graph's table); without either, unannotated nodes form their own stream. Likewise the
device of each stream, ``gm.meta[STREAM_DEVICES_META]`` ({index: device}): a node on CPU
tensors under an accelerator's stream runs on the host, in the CPU's program order.

Subgraphs a higher-order op calls (``torch.cond`` branches) are checked too, each on its
own, and their findings say which subgraph: a branch's inputs count as ready when it
starts, and what crosses the branch's boundary is judged at the node that calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch.fx

from ..fx.subgraphs import reachable
from .graph_view import GraphView, StreamKey, Sync, read_graph
from .happens_before import HappensBefore
from .hazards import Finding, StreamName, data_races, memory_reuse

CURRENT_STREAMS_META = "torch_userstreams.current_streams"
STREAM_DEVICES_META = "torch_userstreams.stream_devices"


@dataclass
class SafetyResult:
    """The findings of one check; truthy when there are none."""

    findings: list[Finding] = field(default_factory=list)
    syncs: list[str] = field(default_factory=list)  # each sync as issued, for the report

    def __bool__(self) -> bool:
        return not self.findings

    def __str__(self) -> str:
        if not self.findings:
            return "no stream hazards"
        lines = [f"{len(self.findings)} stream hazard(s):"]
        lines.extend(f"  {finding}" for finding in self.findings)
        if self.syncs:
            lines.append("syncs, in issue order:")
            lines.extend(f"  {sync}" for sync in self.syncs)
        return "\n".join(lines)


def _stream_namer(current_streams: Mapping[str, int]) -> StreamName:
    current = set(current_streams.values())

    def name(stream: StreamKey) -> str:
        if stream is None:
            return "the current stream"
        if stream in current:
            return f"stream {stream} (current)"
        return f"stream {stream}"

    return name


def _describe_sync(sync: Sync) -> str:
    args = ", ".join(getattr(arg, "name", repr(arg)) for arg in sync.args)
    return f"{sync.node.name}: {sync.name}({args})"


def check_stream_safety(
    gm: torch.fx.GraphModule, *, current_streams: Mapping[str, int] | None = None
) -> SafetyResult:
    """Every RAW/WAR/WAW and memory-reuse hazard between the streams of ``gm``."""
    if not isinstance(gm, torch.fx.GraphModule):
        raise TypeError(
            "check_stream_safety checks a torch.fx.GraphModule, not "
            f"{type(gm).__name__}: pass a graph a backend received, or an item of "
            "torch_userstreams.testing.capture(fn, *args).forward or .backward."
        )
    if current_streams is None:
        current_streams = gm.meta.get(CURRENT_STREAMS_META, {})
    # Keys are devices as str() writes them ("cpu", "cuda:0"): a torch.device key given by
    # the caller is turned into that form, or it would never match.
    current_streams = {_device_key(device): index for device, index in current_streams.items()}
    devices = gm.meta.get(STREAM_DEVICES_META, {})
    result = SafetyResult()
    # Each graph on its own: a branch's inputs count as ready when it starts, and what
    # crosses its boundary is judged at the calling node.
    for sub in reachable(gm):
        _check_one(sub.module, current_streams, devices, sub.where(), result)
    return result


def _device_key(device: object) -> str:
    if isinstance(device, (torch.device, str)):
        return str(device)
    raise TypeError(
        "check_stream_safety: current_streams maps a device ('cuda:0', or a torch.device) "
        f"to the current stream's table index; {device!r} is not a device"
    )


def _check_one(
    gm: torch.fx.GraphModule,
    current_streams: Mapping[str, int],
    devices: Mapping[int, str],
    where: str,
    result: SafetyResult,
) -> None:
    view: GraphView = read_graph(gm, current_streams, devices)
    hb = HappensBefore(view.steps)
    name = _stream_namer(current_streams)
    for finding in (*data_races(view, hb, name), *memory_reuse(view, hb, name)):
        result.findings.append(replace(finding, detail=where + finding.detail))
    result.syncs += [where + _describe_sync(step) for step in view.steps if isinstance(step, Sync)]


def assert_stream_safe(
    gm: torch.fx.GraphModule, *, current_streams: Mapping[str, int] | None = None
) -> None:
    """Raise ``AssertionError`` with the findings and the graph if ``gm`` has a hazard."""
    result = check_stream_safety(gm, current_streams=current_streams)
    if not result:
        raise AssertionError(f"{result}\n{gm.graph}")
