"""A compiled DDP training step with side streams against eager DDP: 2 gloo ranks on CPU.

The distributed demo's training (``torch_userstreams.demo.distributed``): every rank trains
eager DDP and ``torch.compile(DDP(model), backend="userstreams")`` from one seed, in one run;
the row is rank 0's steps/s of both (all ranks' numbers are in the details).
"""

from __future__ import annotations

import dataclasses
import traceback
from typing import Any

import torch
import torch.distributed as dist

from torch_userstreams.demo.config import DemoConfig
from torch_userstreams.demo.distributed import train_rank
from torch_userstreams.testing.ranks import run_on_ranks

from .config import Config
from .results import Row

BENCH = "distributed"
WORLD = 2
CASE = "DDP step/s, 2 gloo ranks: compiled (userstreams) over eager"


def ddp_rank(rank: int, world_size: int, steps: int) -> dict[str, Any]:
    """One intra-op thread per rank, as the demo trains: two ranks share two cores."""
    torch.set_num_threads(1)
    config = DemoConfig(steps=steps, progress=False)
    return dataclasses.asdict(train_rank(rank, world_size, config))


def run(config: Config) -> list[Row]:
    if not dist.is_available() or not dist.is_gloo_available():
        return [Row(BENCH, "skipped: no torch.distributed with gloo", None, None, "", skipped=True)]
    steps = 20 if config.calls <= 2_000 else 60
    try:
        reports = run_on_ranks(ddp_rank, WORLD, steps)
    except Exception:  # a failing run is reported, the other benchmarks still count
        error = traceback.format_exc()
        return [Row(BENCH, CASE, None, None, "steps/s", ok=False, details={"error": error})]
    first = reports[0]
    eager, compiled = first["eager_steps_per_s"], first["compiled_steps_per_s"]
    ratio = compiled / eager if eager and compiled else None
    details = {"ranks": reports, "steps": steps}
    return [Row(BENCH, CASE, eager, compiled, "steps/s", ratio=ratio, details=details)]
