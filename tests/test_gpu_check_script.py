"""``tools/gpu_check.sh`` on a machine where torch sees no CUDA device."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "gpu_check.sh"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
@pytest.mark.skipif(shutil.which("bash") is None, reason="the script is a bash script")
def test_without_cuda_it_runs_nothing_and_says_why(tmp_path: Path) -> None:
    """Before, every cuda test skipped and the summary said 'passed' for each part."""
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 3, done.stderr
    summary = (tmp_path / "summary.md").read_text().splitlines()
    assert summary[:2] == ["# tools/gpu_check.sh summary", ""]
    assert summary[2].startswith(f"NOT RUN: torch {torch.__version__} sees no CUDA device")
    assert "run this on a machine with a GPU and a CUDA build of torch" in summary[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.md"]  # no part ran
