"""``--timeline``: one training step per stream, from the profiler on CUDA, else the schedule."""

from __future__ import annotations

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


def draw_step(config: DemoConfig) -> str:
    """Draw the timeline to ``config.timeline``; return a line saying what was drawn."""
    assert config.timeline is not None, "draw_step needs config.timeline"
    timeline = step_timeline(config)
    render(timeline, config.timeline)
    return (
        f"timeline written to {config.timeline}: {timeline.title}; {len(timeline.lanes)} "
        f"lanes, {len(timeline.boxes)} items ({timeline.count(RECORD)} records, "
        f"{timeline.count(WAIT)} waits), {len(timeline.arrows)} arrows"
    )
