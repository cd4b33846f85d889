"""A second process with a warm Inductor cache compiles the same stream training step:
Inductor's FX graph cache serves every region, the gradients are eager's, each call syncs its
own streams, and AOTAutograd's cache is bypassed (a hit would skip the passes' requests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

CHILD = Path(__file__).parent / "cache_child.py"
TIMEOUT_S = 300


def run_child(cache_dir: Path) -> dict[str, Any]:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    done = subprocess.run(
        [sys.executable, str(CHILD)],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_second_process_uses_the_warm_cache_and_its_own_objects(tmp_path: Path) -> None:
    first = run_child(tmp_path)
    second = run_child(tmp_path)
    for run in (first, second):
        assert run["grads_ok"] and run["objects_ok"] and run["bypass_logged"], run
        assert run["autograd_cache_hit"] == 0, run
    assert first["fxgraph_cache_miss"] > 0 and first["fxgraph_cache_hit"] == 0, first
    assert second["fxgraph_cache_hit"] == first["fxgraph_cache_miss"], second
    assert second["fxgraph_cache_miss"] == 0, second
