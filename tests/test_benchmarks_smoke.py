"""Smoke test: ``python -m benchmarks`` runs end to end at a tiny size, in-process.

It does not check speed (too noisy for CI); it checks that every benchmark produces rows
of the documented shape, that the live-object count shows the leak natively and not with
the package, and that the run leaves the process unpatched.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import torch_userstreams

REPO_ROOT = Path(__file__).resolve().parent.parent
CALLS = 50
ROW_KEYS = {
    "benchmark",
    "case",
    "native",
    "package",
    "unit",
    "ratio",
    "target",
    "ok",
    "skipped",
    "details",
    "torch",
    "python",
    "machine",
    "date",
}


@pytest.fixture(scope="module")
def run_output(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], str]:
    """(JSON rows, table text) of one tiny run; benchmarks/ is not an installed package."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    entry = importlib.import_module("benchmarks.__main__")
    path = tmp_path_factory.mktemp("benchmarks") / "results.json"
    capture = tmp_path_factory.mktemp("stdout") / "stdout.txt"
    with capture.open("w") as out:
        stdout, sys.stdout = sys.stdout, out
        try:
            code = entry.main(["--calls", str(CALLS), "--repeats", "2", "--json", str(path)])
        finally:
            sys.stdout = stdout
    assert code == 0
    return json.loads(path.read_text()), capture.read_text()


def test_rows_have_the_documented_shape(run_output: tuple[list[dict[str, Any]], str]) -> None:
    rows, text = run_output
    assert {row["benchmark"] for row in rows} == {
        "overhead",
        "live_objects",
        "compile_time",
        "cuda",
        "demo",
        "distributed",
    }
    for row in rows:
        assert set(row) == ROW_KEYS, row["case"]
        if row["benchmark"] != "cuda":
            # Differences of medians can dip below zero at this tiny size: only check shape.
            assert isinstance(row["native"], (int, float)), row["case"]
            assert "error" not in row["details"], row["details"]
    cases = [row["case"] for row in rows]
    assert "compile (first step), fake accelerator: userstreams over inductor without streams" in (
        cases
    )
    header = next(line for line in text.splitlines() if line.startswith("benchmark"))
    assert header.split() == ["benchmark", "case", "native", "package", "ratio/target"]


def test_live_objects_grow_natively_and_not_with_the_package(
    run_output: tuple[list[dict[str, Any]], str],
) -> None:
    rows, _ = run_output
    (growth,) = (r for r in rows if r["benchmark"] == "live_objects" and r["unit"] == "objects")
    assert growth["details"]["calls"] == CALLS
    assert growth["native"] == 2 * CALLS
    assert growth["package"] == 0
    assert growth["ok"] is True


def test_run_leaves_the_process_unpatched(run_output: tuple[list[dict[str, Any]], str]) -> None:
    assert not torch_userstreams.is_installed()


def test_the_diagnostic_contender_saves_no_bool_mask() -> None:
    """The demo's diagnostic contender is only evidence if its joint pass changes what the
    forward saves for the relu backward: a bool mask natively, a float activation with it.
    As in the benchmark, a second model of the same class compiles after one compiled with
    plain Inductor, without resetting Dynamo (which would otherwise reuse the first graph)."""
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    from benchmarks.inductor_gap import compile_with_masks_recomputed

    def saved_dtypes(compiled: Any) -> list[str]:
        out = compiled(torch.randn(4, 8))
        return sorted(str(t.dtype) for t in out.grad_fn.saved_tensors)

    torch._dynamo.reset()
    try:
        plain, recomputed = ReluLinear(), ReluLinear()
        dtypes = {
            "inductor": saved_dtypes(torch.compile(plain, backend="inductor")),
            "recomputed": saved_dtypes(compile_with_masks_recomputed(recomputed)),
        }
    finally:
        torch._dynamo.reset()
    assert dtypes == {
        "inductor": ["torch.bool", "torch.float32"],
        "recomputed": ["torch.float32", "torch.float32"],
    }


class ReluLinear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("--calls", "0"), "argument --calls: 0: must be 1 or more"),
        (("--repeats", "-3"), "argument --repeats: -3: must be 1 or more"),
        (("--json", "{file}/rows.json"), "{file} is not a directory"),
    ],
)
def test_bad_options_are_refused_before_any_benchmark_runs(
    args: tuple[str, ...],
    expected: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    entry = importlib.import_module("benchmarks.__main__")
    monkeypatch.setattr(entry, "run_all", lambda config: pytest.fail("a benchmark ran"))
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(SystemExit) as exc:
        entry.main([arg.format(file=a_file) for arg in args])
    assert exc.value.code == 2
    assert expected.format(file=a_file) in capsys.readouterr().err


def test_the_one_call_rows_measure_native_inductors_streams_beside_the_package() -> None:
    """Issue 38's diagnostic: one call per graph with the model's streams (native Inductor
    installed, ``userstreams`` by default) and ``userstreams``'s regions, each over
    Inductor on the model without streams, from one run (on 2.11 the installed package
    places native Inductor's nodes on their streams too)."""
    from benchmarks.accelerator_step import (
        ONE_CALL,
        USERSTREAMS,
        USERSTREAMS_REGIONS,
        one_call_rows,
    )

    rows = one_call_rows(1, 2)
    assert [row.case.split(": ")[1] for row in rows] == [
        f"{ONE_CALL} over inductor without streams",
        f"{USERSTREAMS} over inductor without streams",
        f"{USERSTREAMS_REGIONS} over inductor without streams",
    ]
    for row in rows:
        assert row.native is not None and row.native > 0
        assert row.package is not None and row.package > 0
        assert row.ratio is not None and row.ratio > 0
    assert not torch_userstreams.is_installed()


def test_the_host_calls_row_counts_more_calls_for_the_package_than_inductor_alone() -> None:
    """The fake accelerator simulates each sync and stream switch in Python: the package's
    step makes more calls than Inductor's on the model without streams, and the count is
    the same every time (the profiler counts, nothing is timed)."""
    from benchmarks.accelerator_step import host_calls_rows

    [row] = host_calls_rows(2)
    [again] = host_calls_rows(2)
    assert row.native is not None and row.package is not None
    assert row.package > row.native > 0
    assert (row.native, row.package) == (again.native, again.package)
    assert not torch_userstreams.is_installed()
