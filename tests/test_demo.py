"""``python -m torch_userstreams.demo``, run in-process on CPU with a few steps."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import torch

import torch_userstreams
from torch_userstreams.demo import main
from torch_userstreams.demo.timeline import RECORD, WAIT
from torch_userstreams.demo.trace import timeline_from_trace

TOLERANCE = 1e-5
BASE = ["--device", "cpu", "--no-progress"]


def run_demo(*args: str) -> tuple[int, str]:
    out = io.StringIO()
    status = main([*BASE, *args], out=out)
    return status, out.getvalue()


def columns(text: str) -> list[str]:
    """The column titles of the summary table: the line above its ``---`` rule."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("---"))
    return re.split(r"\s{2,}", lines[rule - 1].strip())


def row(text: str, label: str) -> list[str]:
    """The cells of a summary table row (columns are separated by two or more spaces)."""
    line = next(line for line in text.splitlines() if line.startswith(label))
    return re.split(r"\s{2,}", line[len(label) :].strip())


def test_summary_parity_live_objects_and_tables() -> None:
    threads = torch.get_num_threads()
    status, text = run_demo("--steps", "3")
    assert status == 0, text
    parity = r"parity with eager OK .*: loss (\S+) over 3 steps, final gradients (\S+)"
    match = re.search(parity, text)
    assert match, text
    assert float(match[1]) <= TOLERANCE and float(match[2]) <= TOLERANCE
    assert row(text, "steps completed") == ["3/3", "3/3"]
    # One call's objects stay bound until the next call; nothing accumulates per step.
    entries = int(re.search(r"user objects of graph .*: (\d+)", text)[1])  # type: ignore[index]
    package = columns(text).index("package (userstreams)")  # cells after the label
    counts = row(text, "live streams+events start/step 1/end")[package]
    start, first, end = (int(n) for n in counts.split(" / "))
    assert end == first and end - start <= 2 * entries, text
    assert row(text, "live growth after step 1")[package] == "+0 over 2 steps"
    assert "graph-created  forward  Stream" in text and "requested      backward" in text
    assert not torch_userstreams.is_installed() and torch.get_num_threads() == threads


def test_compare_native_reports_native_side_by_side() -> None:
    status, text = run_demo("--steps", "2", "--compare-native")
    assert status == 0, text
    assert columns(text) == ["eager", "package (userstreams)", "native (inductor)"]
    native_status = row(text, "status")[2]
    live = row(text, "live streams+events start/step 1/end")[2]
    assert native_status == "ok" or native_status.startswith("failed: "), text
    assert re.fullmatch(r"\d+ / (\d+|-) / \d+", live), live
    if native_status == "ok":
        assert row(text, "steps completed")[2] == "2/2"


def test_svg_timeline_of_one_step(tmp_path: Path) -> None:
    out = tmp_path / "step.svg"
    status, text = run_demo("--steps", "1", "--timeline", str(out))
    assert status == 0, text
    svg = out.read_text()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "forward 0" in svg and "backward 0" in svg
    assert "(graph-created)" in svg and "(current stream)" in svg
    assert 'marker-end="url(#head)"' in svg  # an arrow from a record to its wait
    assert f"timeline written to {out}" in text


def test_png_without_matplotlib_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    with pytest.raises(SystemExit) as exc:
        main([*BASE, "--timeline", "out.png"])
    assert exc.value.code == 2
    message = capsys.readouterr().err
    assert "pip install matplotlib" in message and ".svg" in message


def test_cuda_trace_lanes_per_stream() -> None:
    trace = {
        "traceEvents": [
            {"ph": "X", "cat": "kernel", "name": "mm", "ts": 100, "dur": 5, "args": {"stream": 7}},
            {"ph": "X", "cat": "kernel", "name": "add", "ts": 102, "dur": 2, "args": {"stream": 9}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "ts": 101, "dur": 1},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "ts": 103, "dur": 1},
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 90, "dur": 20},
        ]
    }
    timeline = timeline_from_trace(trace)
    assert timeline is not None
    assert timeline.lanes == ["cuda stream 7", "cuda stream 9", "host: CUDA event calls"]
    assert [(b.lane, b.start, b.length) for b in timeline.boxes[:2]] == [
        ("cuda stream 7", 0.0, 5.0),
        ("cuda stream 9", 2.0, 2.0),
    ]
    assert timeline.count(RECORD) == 1 and timeline.count(WAIT) == 1
    assert timeline_from_trace({"traceEvents": trace["traceEvents"][2:]}) is None
