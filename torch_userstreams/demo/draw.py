"""``--timeline`` and ``--trace``: one training step per stream, from the profiler on CUDA,
else what the compiled graphs issue; drawn, written as a Chrome trace, or both (one step
is profiled or captured once for both)."""

from __future__ import annotations

from .chrome import write_chrome_trace
from .config import DemoConfig
from .render import render
from .schedule import schedule_step
from .timeline import RECORD, WAIT, Timeline


def step_timeline(config: DemoConfig) -> Timeline:
    """The profiled step on CUDA when the trace has GPU work; the graph schedule otherwise."""
    if config.device.type == "cuda":
        from .trace import profile_step

        profiled = profile_step(config)
        if profiled is not None:
            return profiled
    return schedule_step(config)


def _contents(timeline: Timeline) -> str:
    left_out = timeline.left_out()
    hollow = f", {left_out} syncs not issued (hollow)" if left_out else ""
    return (
        f"{timeline.title}; {len(timeline.lanes)} lanes, {len(timeline.boxes)} items "
        f"({timeline.count(RECORD)} records, {timeline.count(WAIT)} waits issued{hollow}), "
        f"{len(timeline.arrows)} arrows"
    )


def draw_step(config: DemoConfig) -> str:
    """Write ``config.timeline`` and/or ``config.trace``; return lines saying what was."""
    assert config.timeline or config.trace, "draw_step needs config.timeline or config.trace"
    timeline = step_timeline(config)
    lines = []
    if config.timeline is not None:
        render(timeline, config.timeline)
        lines.append(f"timeline written to {config.timeline}: {_contents(timeline)}")
    if config.trace is not None:
        write_chrome_trace(timeline, config.trace)
        lines.append(
            f"trace written to {config.trace} (Chrome trace: open it in https://ui.perfetto.dev "
            f"or chrome://tracing): {_contents(timeline)}"
        )
    return "\n".join(lines)
