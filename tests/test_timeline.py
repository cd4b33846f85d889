"""The demo's timeline: lanes named as the user's code names its streams, op names drawn on
the boxes, a caption saying what x is and whether the syncs ran, syncs the backend leaves
out drawn hollow, and the same timeline as a Chrome trace."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import torch

from torch_userstreams.demo.chrome import NOT_ISSUED, to_chrome_trace, write_chrome_trace
from torch_userstreams.demo.config import DemoConfig
from torch_userstreams.demo.names import _user_call, source_expression
from torch_userstreams.demo.schedule import schedule_step, schedule_timeline
from torch_userstreams.demo.svg import fitted, to_svg
from torch_userstreams.demo.timeline import (
    KERNEL,
    MICROSECONDS,
    RECORD,
    WAIT,
    Arrow,
    Box,
    Section,
    Timeline,
)
from torch_userstreams.demo.trace import timeline_from_trace
from torch_userstreams.testing.capture import capture, no_compile_caches
from torch_userstreams.testing.fake_accelerator import (
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)

SVG = "{http://www.w3.org/2000/svg}"
SMALL = DemoConfig(dim=8, blocks=2, batch=4, backend="userstreams_aot_eager")


def drawn_text(svg: str) -> list[str]:
    """The text of every <text> element: what is drawn, not the hover <title>s."""
    return [el.text or "" for el in ET.fromstring(svg).iter(f"{SVG}text")]


def hollow_markers(svg: str) -> int:
    return svg.count('fill="white" stroke=')


def test_lanes_and_events_carry_the_names_the_users_code_gives_them() -> None:
    timeline = schedule_step(SMALL)
    assert timeline.lanes == [
        "model.blocks.0.main",
        "model.blocks.0.side",
        "model.blocks.1.main",
        "model.blocks.1.side",
        "current",
    ]
    forward = [b for b in timeline.boxes if b.start < timeline.sections[0].end]
    fork = [(b.kind, b.lane, b.label) for b in forward if b.kind != KERNEL][:4]
    assert fork == [
        (RECORD, "model.blocks.0.main", "ready"),  # ready.record(main)
        (WAIT, "model.blocks.0.side", "ready"),  # ready.wait(side)
        (RECORD, "model.blocks.0.side", "done"),  # done.record(side)
        (WAIT, "model.blocks.0.main", "done"),  # done.wait(main)
    ]
    assert {a.label for a in timeline.arrows} >= {"model.blocks.0.ready", "model.blocks.1.done"}
    # The side branch's linear and tanh run on the side lane, the loss on the current one.
    side = {b.label for b in forward if b.lane == "model.blocks.0.side" and b.kind == KERNEL}
    assert {"addmm", "tanh"} <= side
    assert "mse_loss" in {b.label for b in forward if b.lane == "current"}


def test_op_names_are_drawn_on_the_boxes_and_the_caption_says_what_ran() -> None:
    timeline = schedule_step(SMALL)
    svg = to_svg(timeline)
    text = drawn_text(svg)
    for name in ("addmm", "tanh", "relu", "mse_loss", "ready", "done", "model.blocks.0.side"):
        assert name in text, name
    # aot_eager issues every sync: nothing hollow, every record-to-wait arrow drawn.
    assert timeline.left_out() == 0 and hollow_markers(svg) == 1  # the legend's
    caption = " ".join(text)
    assert "x: the order the compiled program issues its work" in caption
    assert "positions, not time" in caption
    assert "every sync drawn is issued" in caption and "userstreams_aot_eager" in caption


def fork_join(
    x: torch.Tensor, w: torch.Tensor, v: torch.Tensor, side: torch.Stream, done: torch.Event
) -> torch.Tensor:
    with side:
        a = torch.sin(x * w)
        b = torch.cos(x * v)
    done.record(side)
    done.wait()  # the current stream
    return a + b


def test_redundant_waits_the_backend_leaves_out_are_hollow_with_no_arrow() -> None:
    """On an accelerator ``userstreams`` leaves out a backward exit's waits for gradients
    whose stream the current stream already waited for (``redundant_syncs``): drawn solid,
    they would show syncs that never run."""
    with fake_accelerator(gpu_semantics=True), no_compile_caches():
        x, w, v = (
            torch.randn(4),
            torch.randn(4, requires_grad=True),
            torch.randn(4, requires_grad=True),
        )
        side, done = FakeAcceleratorStream(), FakeAcceleratorEvent()
        captured = capture(fork_join, x, w, v, side, done, backend="userstreams")
    timeline = schedule_timeline(captured.graphs, captured.tables, "userstreams")
    assert timeline.lanes[:2] == ["side", "current"]  # inputs: their sources' names
    assert ("done", "side") in {(b.label, b.lane) for b in timeline.boxes if b.kind == RECORD}
    left_out = [b for b in timeline.boxes if not b.issued]
    assert left_out and all(b.kind in (RECORD, WAIT) for b in left_out)
    assert all(b.detail.startswith("not issued") for b in left_out)
    assert timeline.count(WAIT) > 0  # the waits that do run stay solid
    hollow_waits = {(b.lane, b.start) for b in left_out if b.kind == WAIT}
    assert not hollow_waits & {(a.end_lane, a.end) for a in timeline.arrows}
    assert f"the {len(left_out)} hollow ones never run" in timeline.caption[1]
    assert hollow_markers(to_svg(timeline)) == len(left_out) + 1  # and the legend's


def test_chrome_trace_has_a_named_thread_per_lane_slices_flows_and_no_unissued_slice(
    tmp_path: Path,
) -> None:
    timeline = Timeline("t", "position", lanes=["main", "side"], caption=["x: program order"])
    timeline.boxes += [
        Box("main", 0, 1, "mm", KERNEL),
        Box("main", 1, 1, "ready", RECORD),
        Box("side", 2, 1, "ready", WAIT),
        Box("side", 3, 1, "add", KERNEL),
        Box("main", 4, 1, "gone", WAIT, issued=False),
    ]
    timeline.arrows.append(Arrow("main", 1, "side", 2, "ready"))
    timeline.sections.append(Section("forward 0", 0, 5))
    path = tmp_path / "deeper" / "step.json"
    write_chrome_trace(timeline, path)
    with path.open() as f:
        trace = json.load(f)
    events = trace["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    tid = {name: t for t, name in threads.items()}
    assert set(threads.values()) == {"graphs", "main", "side"}
    slices = [(threads[e["tid"]], e["name"], e["ts"], e["dur"]) for e in events if e["ph"] == "X"]
    assert slices == [
        ("graphs", "forward 0", 0, 5),
        ("main", "mm", 0, 1),
        ("main", "record ready", 1, 1),
        ("side", "wait ready", 2, 1),
        ("side", "add", 3, 1),
    ]
    flows = {e["ph"]: e for e in events if e["ph"] in ("s", "f")}
    assert flows["s"]["id"] == flows["f"]["id"] and flows["f"]["bp"] == "e"
    assert (flows["s"]["tid"], flows["s"]["ts"]) == (tid["main"], 1.5)  # inside the record
    assert (flows["f"]["tid"], flows["f"]["ts"]) == (tid["side"], 2.5)  # inside the wait
    (instant,) = [e for e in events if e["ph"] == "i"]
    assert instant["cat"] == NOT_ISSUED and instant["tid"] == tid["main"]
    process = next(e for e in events if e["name"] == "process_name")["args"]["name"]
    assert "program order: 1 us = 1 step, not time" in process
    assert trace["otherData"]["caption"] == ["x: program order"]


def test_a_profiled_step_keeps_its_microseconds_and_says_so() -> None:
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "mm", "ts": 100, "dur": 5, "args": {"stream": 7}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "ts": 103, "dur": 1},
        ]
    }
    timeline = timeline_from_trace(trace)
    assert timeline is not None and timeline.unit == MICROSECONDS
    assert timeline.caption[0].startswith("x: microseconds") and "ran" in timeline.caption[1]
    chrome = to_chrome_trace(timeline)
    kernel = next(e for e in chrome["traceEvents"] if e.get("name") == "mm")
    assert (kernel["ts"], kernel["dur"]) == (0.0, 5.0)
    process = next(e for e in chrome["traceEvents"] if e["name"] == "process_name")
    assert "not time" not in process["args"]["name"]


def test_names_come_from_the_call_the_user_wrote() -> None:
    trace = '  File "m.py", line 3, in forward\n    ready.record(self.main)  # fork\n'
    assert _user_call(trace, "record_event") == [(0, "ready"), (1, "self.main")]
    assert _user_call(trace.replace("ready.record", "main.wait_event"), "wait_event") == [
        (1, "main"),
        (0, "self.main"),
    ]
    assert _user_call(trace, "wait_event") is None  # not the call that issued this op
    assert _user_call('  File "m.py", line 3, in f\n    with side:\n', "record_event") is None
    two = '  File "m.py", line 3, in f\n    a.record(s); b.record(s)\n'
    assert _user_call(two, "record_event") is None  # which one is not known
    assert source_expression("L['side']") == "side"
    assert source_expression("L['self'].streams[0]") == "self.streams[0]"


def test_labels_are_cut_to_the_room_they_have() -> None:
    assert fitted("addmm", 100, 10) == "addmm"
    assert fitted("threshold_backward", 60, 10) == "threshold\u2026"
    assert fitted("addmm", 10, 10) == ""
