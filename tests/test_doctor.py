"""``python -m torch_userstreams doctor``: exit status and what it names, patching nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from torch_userstreams.__main__ import main
from torch_userstreams.patch import install as patching
from torch_userstreams.patch.points import POINTS, minor_of

MINOR = minor_of(torch.__version__)


def status_of(output: str, name: str) -> str:
    """The status word of the report line naming ``name`` exactly."""
    for line in output.splitlines():
        words = line.split()
        if len(words) >= 2 and words[1] == name:
            return words[0]
    raise AssertionError(f"{name} not in doctor output:\n{output}")


def test_doctor_finds_every_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert torch.__version__ in out and "supported" in out and "not supported" not in out
    for point in POINTS[MINOR]:
        assert status_of(out, point.name) == "found"
    assert not patching.is_installed(), "doctor must not patch anything"


def test_doctor_unsupported_version_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(torch, "__version__", "2.16.0")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert "2.16.0" in out and "not supported" in out
    assert "accelerator" in out and "python" in out  # it still reports what it can


def test_doctor_names_a_missing_point(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch._dynamo.variables.streams as streams

    monkeypatch.delattr(streams, "new_stream")
    assert main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert status_of(out, "torch._dynamo.variables.streams.new_stream") == "missing"
    assert "new_stream is gone" in out
    assert status_of(out, "torch._dynamo.variables.streams.new_event") == "found"


def test_doctor_as_a_module_exits_0() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "torch_userstreams", "doctor"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout
