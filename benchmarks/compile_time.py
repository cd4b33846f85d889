"""Fresh-compile time (first call) of (a), (b), (c), package vs native.

The package adds a table per graph and a generated prologue; this shows what that adds to
the time a user waits for the first call.
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch

from .config import Config
from .modes import MODES, interleaved, patched
from .results import Row, ratio_row
from .timing import median
from .workloads import cpu_workloads

BENCH = "compile_time"


def first_call_ms(package: bool) -> dict[str, float]:
    """ms for the first call of each workload, Dynamo reset before each."""
    times = {}
    with patched(package):
        for name, fn, args in cpu_workloads():
            torch._dynamo.reset()
            start = time.perf_counter_ns()
            torch.compile(fn, backend="eager")(*args)
            times[name] = (time.perf_counter_ns() - start) / 1e6
    return times


def run(config: Config) -> list[Row]:
    for mode in MODES:  # discarded: lazy imports and first-use caches of either mode
        first_call_ms(mode)
    samples: dict[tuple[str, bool], list[float]] = defaultdict(list)
    for mode in interleaved(config.compile_repeats):
        for name, ms in first_call_ms(mode).items():
            samples[name, mode].append(ms)
    rows = []
    for name, _, _ in cpu_workloads():
        native, package = (median(samples[name, p]) for p in MODES)
        details = {"native_ms": samples[name, False], "package_ms": samples[name, True]}
        rows.append(ratio_row(BENCH, name, native, package, "ms", details=details))
    return rows
