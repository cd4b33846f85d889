"""``python -m torch_userstreams.demo``, run in-process on CPU with a few steps."""

from __future__ import annotations

import io
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

import torch_userstreams
from torch_userstreams.demo import cli, main
from torch_userstreams.demo.config import DemoConfig
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
    status, text = run_demo("--steps", "3", "-v")
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


def test_svg_timeline_and_chrome_trace_of_one_step(tmp_path: Path) -> None:
    """On CPU the default backend compiles each graph without its syncs: the drawing shows
    the code's syncs hollow, draws no arrow, and its caption says that none ran."""
    out, trace = tmp_path / "step.svg", tmp_path / "step.json"
    status, text = run_demo("--steps", "2", "--timeline", str(out), "--trace", str(trace))
    assert status == 0, text
    svg = out.read_text()
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    drawn = [el.text or "" for el in ET.fromstring(svg).iter("{http://www.w3.org/2000/svg}text")]
    lanes = ["model.blocks.0.main", "model.blocks.0.side", "model.blocks.1.side", "current"]
    assert set(lanes) <= set(drawn) and "forward 0" in drawn and "backward 0" in drawn
    assert {"addmm", "tanh", "ready", "done"} <= set(drawn)  # drawn, not only hover text
    caption = " ".join(drawn)
    assert "syncs: none ran. On CPU, backend 'userstreams' compiles each graph without" in caption
    assert 'marker-end="url(#head)"' not in svg.split("</defs>")[1]  # no sync ran: no arrow
    assert f"timeline written to {out}" in text and "0 waits issued" in text

    with trace.open() as f:
        events = json.load(f)["traceEvents"]
    threads = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert set(lanes) <= set(threads.values())
    per_lane = {name: 0 for name in threads.values()}
    for event in events:
        if event["ph"] == "X":
            per_lane[threads[event["tid"]]] += 1
    assert all(per_lane[lane] > 0 for lane in lanes), per_lane
    assert not [e for e in events if e["ph"] == "X" and e["cat"] in (RECORD, WAIT)]
    assert {e["cat"] for e in events if e["ph"] == "i"} == {"not issued"}
    assert f"trace written to {trace}" in text and "ui.perfetto.dev" in text


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


def refusal(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """The parser's one-line error for ``args``: it exits 2 before any training."""
    with pytest.raises(SystemExit) as exc:
        main([*BASE, *args])
    assert exc.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--steps", "1"), "--steps 1: must be in 2..10000 (the first step compiles"),
        (("--steps", "1000000000"), "--steps 1000000000: must be in 2..10000"),
        (("--threads", "-1"), "--threads -1: must be in 1.."),
        (("--threads", "1000000"), "--threads 1000000: must be in 1.."),
        (("--seed", "-1"), "--seed -1: must be in 0..9223372036854775807"),
        (("--seed", str(2**64)), f"--seed {2**64}: must be in 0..9223372036854775807"),
    ],
)
def test_numbers_out_of_range_are_refused_before_training(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], expected: str
) -> None:
    assert expected in refusal(capsys, *args)


def test_distributed_without_torchrun_or_with_single_process_options_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    message = refusal(capsys, "--distributed")
    assert "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set" in message
    assert "torchrun --nproc-per-node N -m torch_userstreams.demo --distributed" in message
    message = refusal(capsys, "--distributed", "--compare-native")
    assert "--compare-native is not supported with --distributed" in message
    message = refusal(capsys, "--distributed", "--timeline", str(tmp_path / "t.svg"))
    assert "--timeline is not supported with --distributed" in message
    message = refusal(capsys, "--distributed", "--trace", str(tmp_path / "t.json"))
    assert "--trace is not supported with --distributed" in message


def test_an_unwritable_timeline_path_is_refused_before_training(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    folder = tmp_path / "a-folder.svg"
    folder.mkdir()
    assert "is a directory; give a file path" in refusal(capsys, "--timeline", str(folder))
    # A folder without a suffix was blamed on a missing matplotlib.
    assert refusal(capsys, "--timeline", str(tmp_path)).endswith(
        f"--timeline {tmp_path}: is a directory; give a file path"
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    message = refusal(capsys, "--timeline", str(blocker / "sub" / "t.svg"))
    assert f"{blocker} is not a directory" in message
    # A folder that does not exist yet is fine: the writer creates it.
    assert cli.output_problem("--timeline", tmp_path / "new" / "deeper" / "t.svg") is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "a-folder.svg"]  # no probe


def test_an_unwritable_trace_path_is_refused_before_training(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert refusal(capsys, "--trace", str(tmp_path)).endswith(
        f"--trace {tmp_path}: is a directory; give a file path"
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    message = refusal(capsys, "--trace", str(blocker / "t.json"))
    assert message.endswith(f"--trace {blocker / 't.json'}: {blocker} is not a directory")
    same = str(tmp_path / "step.svg")
    message = refusal(capsys, "--timeline", same, "--trace", same)
    assert message.endswith(f"--timeline and --trace both name {same}: give two files")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing written


def test_broken_symlinks_on_the_timeline_path_are_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The writer follows links: a dangling one fails it (FileNotFoundError or, as a
    folder, FileExistsError), so the check names the link instead of passing it."""
    missing = tmp_path / "missing"
    (tmp_path / "dangling.svg").symlink_to(missing / "t.svg")
    (tmp_path / "folder-link").symlink_to(missing)
    (tmp_path / "loop.svg").symlink_to(tmp_path / "loop.svg")
    for name in ("dangling.svg", "loop.svg"):
        message = refusal(capsys, "--timeline", str(tmp_path / name))
        assert message.endswith(f"{tmp_path / name}: is a broken symlink (or a loop of them)")
    message = refusal(capsys, "--timeline", str(tmp_path / "folder-link" / "t.svg"))
    assert message.endswith(f"{tmp_path / 'folder-link'} is a broken symlink")


def test_a_folder_that_cannot_be_searched_is_refused_not_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Python 3.10-3.12's Path.exists raises PermissionError under a folder this user cannot
    search (root searches every folder, so the error is injected)."""
    locked = tmp_path / "locked"

    def is_symlink(path: Path) -> bool:
        raise PermissionError(13, "Permission denied", str(locked / "t.svg"))

    monkeypatch.setattr(Path, "is_symlink", is_symlink)
    message = refusal(capsys, "--timeline", str(locked / "t.svg"))
    assert message.endswith(f"cannot write there: Permission denied ({locked / 't.svg'})")


def test_the_edges_of_every_range_are_accepted() -> None:
    parser = cli.build_parser()
    for args in (
        ["--steps", "2", "--threads", "0", "--seed", "0"],
        ["--steps", "10000", "--threads", str(cli.max_threads()), "--seed", str(2**63 - 1)],
        ["--threads", "1"],
    ):
        config = cli.config_from(parser.parse_args([*BASE, *args]), parser)
        given = dict(zip(args[::2], args[1::2], strict=True))
        assert config.steps == int(given.get("--steps", DemoConfig.steps))
        assert config.seed == int(given.get("--seed", 0))
        expected_threads = int(given["--threads"])
        assert config.threads == (None if expected_threads == 0 else expected_threads)


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


def test_the_demo_compiles_its_loss_with_its_model() -> None:
    """``ForwardAndLoss``: the loss ends the one forward graph and its backward starts the
    one backward graph (no eager loss ops around the compiled calls), and the loss is
    eager's."""
    from torch_userstreams.demo.model import (
        ForwardAndLoss,
        build_model,
        make_batches,
        simulated_objects,
    )
    from torch_userstreams.testing import capture

    cpu = torch.device("cpu")
    model = build_model(dim=16, blocks=1, device=cpu, seed=0)
    x, y = make_batches(1, 8, 16, cpu, seed=0)[0]
    captured = capture(ForwardAndLoss(model), x, y)
    assert len(captured.forward) == 1 and len(captured.backward) == 1

    def ops(gm: torch.fx.GraphModule) -> list[object]:
        return [node.target for node in gm.graph.nodes if node.op == "call_function"]

    aten = torch.ops.aten
    assert aten.mse_loss.default in ops(captured.forward[0]), captured.forward[0].graph
    assert aten.mse_loss_backward.default in ops(captured.backward[0]), captured.backward[0].graph
    with simulated_objects(cpu):
        torch.testing.assert_close(captured.result, ForwardAndLoss(model)(x, y))


def test_the_verdict_is_what_a_terminal_shows_last() -> None:
    """The verdict was at line 57 of 185, under 40 lines of pass notes."""
    status, text = run_demo("--steps", "2")
    assert status == 0, text
    summary = text.split("\ndemo wall time")[0].rstrip().splitlines()
    assert summary[-2].startswith("package (userstreams): parity with eager OK"), summary[-4:]
    assert re.match(
        r"package \(userstreams\): [\d.]+x eager's steps/s \(median of 7 pairs of 5-step "
        r"blocks taking turns\); compile \(first step\) [\d.]+ s$",
        summary[-1],
    ), summary


def test_tables_are_shown_with_verbose_only_and_quiet_prints_the_verdict() -> None:
    status, text = run_demo("--steps", "2")
    assert status == 0, text
    assert "user objects of graph" not in text and "-v" in text
    status, quiet = run_demo("--steps", "2", "--quiet")
    assert status == 0, quiet
    lines = quiet.strip().splitlines()
    assert len(lines) == 2, quiet
    assert lines[0].startswith("package (userstreams): parity with eager OK"), quiet
