"""A ``Timeline`` as a Chrome trace (JSON) that Perfetto (ui.perfetto.dev) and
chrome://tracing open: the same lanes, boxes and syncs as the drawing.

One process; one thread per lane, named by ``thread_name`` metadata and kept in the
drawing's order by ``thread_sort_index``, plus a first thread holding a slice per graph;
each op and each issued sync a complete event (``ph`` "X"); each arrow a flow from the
record's slice to the wait's (``s`` and ``f``). A sync the program does not issue is an
instant event (``ph`` "i") of category ``not issued``: nothing in the file says it ran.
Chrome trace times are microseconds: a profiled timeline's are real; a schedule's
positions are written as 1 us per step, which the process name and ``otherData`` say.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .timeline import KERNEL, MICROSECONDS, Timeline

PID = 1
GRAPHS_TID = 1  # lanes are numbered from 2, in the drawing's order
NOT_ISSUED = "not issued"


def _metadata(timeline: Timeline, tids: dict[str, int], real: bool) -> list[dict[str, Any]]:
    unit = "" if real else " (program order: 1 us = 1 step, not time)"
    names = [("process_name", PID, {"name": f"torch_userstreams demo: {timeline.title}{unit}"})]
    names += [("thread_name", GRAPHS_TID, {"name": "graphs"})]
    names += [("thread_name", tid, {"name": lane}) for lane, tid in tids.items()]
    events = [{"ph": "M", "pid": PID, "tid": tid, "name": n, "args": a} for n, tid, a in names]
    events += [
        {
            "ph": "M",
            "pid": PID,
            "tid": tid,
            "name": "thread_sort_index",
            "args": {"sort_index": tid},
        }
        for tid in (GRAPHS_TID, *tids.values())
    ]
    return events


def to_chrome_trace(timeline: Timeline) -> dict[str, Any]:
    """``timeline`` as Chrome trace event format (a dict ready for ``json.dump``)."""
    real = timeline.unit == MICROSECONDS
    tids = {lane: GRAPHS_TID + 1 + i for i, lane in enumerate(timeline.lanes)}
    events = _metadata(timeline, tids, real)
    for section in timeline.sections:
        events.append(_slice(section.title, "graph", section.start, section.end - section.start))
        events[-1]["tid"] = GRAPHS_TID
    for box in timeline.boxes:
        name = box.label if box.kind == KERNEL else f"{box.kind} {box.label}"
        if box.issued:
            event = _slice(name, box.kind, box.start, box.length)
        else:
            name = f"{NOT_ISSUED}: {name}"
            event = {"name": name, "cat": NOT_ISSUED, "ph": "i", "s": "t", "ts": box.start}
        event.update(pid=PID, tid=tids[box.lane], args={"detail": box.title})
        events.append(event)
    mid = 0.0 if real else 0.5  # a flow binds to the slice around its time: a step's middle
    for flow_id, arrow in enumerate(timeline.arrows, start=1):
        common = {"name": arrow.label or "sync", "cat": "sync", "id": flow_id, "pid": PID}
        start, end = arrow.start + mid, arrow.end + mid
        events.append({**common, "ph": "s", "ts": start, "tid": tids[arrow.start_lane]})
        events.append({**common, "ph": "f", "bp": "e", "ts": end, "tid": tids[arrow.end_lane]})
    return {
        "traceEvents": events,
        "otherData": {"title": timeline.title, "x": timeline.unit, "caption": timeline.caption},
    }


def _slice(name: str, category: str, start: float, length: float) -> dict[str, Any]:
    return {"name": name, "cat": category, "ph": "X", "ts": start, "dur": length, "pid": PID}


def write_chrome_trace(timeline: Timeline, path: Path) -> None:
    """Write ``timeline`` to ``path`` as a Chrome trace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_chrome_trace(timeline), indent=1) + "\n")
