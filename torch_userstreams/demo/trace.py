"""One training step on CUDA as the profiler saw it: kernels per CUDA stream.

The step is the package-compiled model with its loss (as the demo trains it), after two
warm-up steps (so it is not a compile).
The profiler's Chrome trace is read back: every GPU kernel, copy and memset goes on the lane
of the stream it ran on, and the host's event record / stream wait calls on a host lane.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..patch.install import installed
from .config import DemoConfig
from .model import ForwardAndLoss, build_model, make_batches
from .timeline import KERNEL, MICROSECONDS, RECORD, WAIT, Box, Section, Timeline

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_SYNCS = {"cudaEventRecord": RECORD, "cudaStreamWaitEvent": WAIT}
HOST_LANE = "host: CUDA event calls"
WARM_UP_STEPS = 2
CAPTION = [
    "x: microseconds since the step's first GPU kernel, as torch.profiler measured them",
    f"syncs: the host's event records and stream waits as they ran (lane '{HOST_LANE}'); "
    "each one drawn was issued",
    "lanes: the CUDA streams the profiler saw, by its stream id",
]


def timeline_from_trace(trace: dict[str, Any]) -> Timeline | None:
    """A timeline of a Chrome trace's GPU work, or None when it has none (e.g. on CPU)."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "ts" in e]
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        return None
    origin = min(float(e["ts"]) for e in gpu)
    timeline = Timeline("one training step on CUDA (profiler)", MICROSECONDS, caption=list(CAPTION))
    for event in sorted(gpu, key=lambda e: float(e["ts"])):
        stream = event.get("args", {}).get("stream", event.get("tid"))
        lane = timeline.lane(f"cuda stream {stream}")
        start, length = float(event["ts"]) - origin, max(float(event.get("dur", 0)), 0.5)
        timeline.boxes.append(Box(lane, start, length, str(event.get("name", "?")), KERNEL))
    for event in events:
        kind = HOST_SYNCS.get(str(event.get("name")))
        if kind is not None and float(event["ts"]) >= origin:
            lane = timeline.lane(HOST_LANE)
            timeline.boxes.append(Box(lane, float(event["ts"]) - origin, 1.0, event["name"], kind))
    timeline.sections.append(Section("training step", 0.0, timeline.end))
    return timeline


def profile_step(config: DemoConfig) -> Timeline | None:
    """Profile one compiled step on ``config.device``; None if the trace has no GPU work."""
    from torch.profiler import ProfilerActivity, profile

    model = build_model(config.dim, config.blocks, config.device, config.seed)
    batches = make_batches(WARM_UP_STEPS + 1, config.batch, config.dim, config.device, config.seed)
    torch._dynamo.reset()
    try:
        with installed():
            compiled = torch.compile(ForwardAndLoss(model), backend=config.backend)
            for x, y in batches[:-1]:
                compiled(x, y).backward()
            torch.cuda.synchronize(config.device)
            x, y = batches[-1]
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                compiled(x, y).backward()
                torch.cuda.synchronize(config.device)
    finally:
        torch._dynamo.reset()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    return timeline_from_trace(trace)
