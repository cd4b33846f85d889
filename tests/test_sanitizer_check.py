"""tools/cuda_sanitizer_check.py: programs race-free in eager, eager as the baseline.

The sanitizer itself needs a GPU (the ``cuda`` test below, and ``tools/gpu_check.sh``);
the rest of the tool — which programs it runs and how it reads the runs — is tested here.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

TOOL = Path(__file__).parent.parent / "tools" / "cuda_sanitizer_check.py"


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cuda_sanitizer_check", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def programs(tool: ModuleType) -> list[Any]:
    return tool.generate(20, seed=0)  # type: ignore[no-any-return]


def test_cuda_programs_fork_from_and_join_to_the_current_stream(programs: list[Any]) -> None:
    for program in programs:
        source = program.source(eager=False, device="cuda")
        body = source.splitlines()
        forks = [i for i, line in enumerate(body) if line.strip().startswith("forked.wait(")]
        joins = [i for i, line in enumerate(body) if line.strip().endswith(".wait(" + _CURRENT)]
        assert len(forks) == len(joins) == len(program.streams), source
        statements = [i for i, line in enumerate(body) if line.startswith("    v")]
        assert max(forks) < min(statements, default=max(forks) + 1), "fork before the body"
        assert min(joins) > max(statements, default=-1), "join after the body"
        assert "forked" not in program.source(eager=False, device="cpu"), "CPU needs no frame"


_CURRENT = "torch.accelerator.current_stream(DEVICE))"


def test_removing_one_fork_wait_drops_exactly_the_wait_of_a_stream_reading_an_input(
    tool: ModuleType, programs: list[Any]
) -> None:
    program = next(p for p in programs if tool.reads_an_input(p))
    stream = tool.reads_an_input(program)
    full = program.source(eager=False, device="cuda").splitlines()
    cut = tool.without_one_fork(program).splitlines()
    assert [line for line in full if line not in cut] == [f"    forked.wait({stream})"]
    assert any(f"with {stream}:" in line for line in full)


def _run(backend: str, statuses: dict[str, str], crashed: bool = False) -> dict[str, Any]:
    if crashed:
        return {"backend": backend, "crashed": 1, "stderr": "boom"}
    return {"backend": backend, "results": {k: {"status": s} for k, s in statuses.items()}}


def test_a_race_counts_against_the_compiler_only_when_eager_was_clean(tool: ModuleType) -> None:
    keys = ["0", "1", "2", "negative"]
    runs = [
        _run("eager", {"0": "ok", "1": "hazard", "2": "ok", "negative": "hazard"}),
        _run("userstreams", {"0": "ok", "1": "hazard", "2": "ok", "negative": "hazard"}),
        _run("inductor", {"0": "hazard", "1": "hazard", "2": "error", "negative": "hazard"}),
        _run("aot_eager", {}, crashed=True),
    ]
    verdict = tool.classify(runs, keys)
    assert verdict["eager"]["hazard"] == ["1", "negative"]
    assert verdict["backends"]["userstreams"]["compiled_only"] == []
    assert verdict["backends"]["inductor"]["compiled_only"] == ["0"]
    assert verdict["backends"]["inductor"]["errors"] == ["2"]
    assert verdict["backends"]["aot_eager"]["crashed"]
    assert tool.negative_check(verdict)
    runs[0]["results"]["negative"]["status"] = "ok"
    assert not tool.negative_check(tool.classify(runs, keys))


def test_the_eager_run_must_come_first(tool: ModuleType) -> None:
    with pytest.raises(ValueError, match="eager baseline"):
        tool.classify([_run("userstreams", {})], [])


@pytest.mark.cuda
def test_on_a_gpu_the_baseline_is_clean_and_a_removed_wait_is_caught(
    tool: ModuleType, tmp_path: Path
) -> None:
    report = tmp_path / "sanitizer.json"
    assert tool.main([str(report), "--programs", "4", "--negative", "--backends"]) == 0
    verdict = json.loads(report.read_text())["verdict"]
    assert verdict["eager"]["hazard"] == ["negative"] and verdict["eager"]["error"] == []
