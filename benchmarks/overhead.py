"""Per-call cost of a compiled call, package vs native, in the same process.

The package replaces native's global user-object table with a per-call binding; these
numbers check that this costs nothing for graphs without streams (a) and little per object
beyond constructing the objects themselves (b), or per input stream (c).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import torch

from torch_userstreams.simulator import SimEvent, SimStream

from .config import Config
from .modes import MODES, interleaved, patched
from .results import Row, ratio_row
from .timing import median, ns_to_us, per_call_ns, warm_up
from .workloads import cpu_workloads

BENCH = "overhead"
MAX_STREAM_FREE_RATIO = 1.02
MAX_US_PER_OBJECT = 1.0
REPO_ROOT = Path(__file__).resolve().parent.parent

Samples = dict[tuple[str, bool], list[float]]  # (workload, package?) -> per-call ns


def _construct_two(n: int, stream_type: type, event_type: type) -> None:
    for _ in range(n):
        stream_type(device="cpu")
        event_type(device="cpu")


def construct_ns(calls: int, simulated: bool = False) -> float:
    """ns to construct one stream plus one event in a Python loop: torch's own types, or
    the simulator subclasses the package builds for CPU objects instead."""
    types = (SimStream, SimEvent) if simulated else (torch.Stream, torch.Event)
    return per_call_ns(_construct_two, (calls, *types), 1) / calls


def _sample_all(config: Config) -> tuple[Samples, dict[bool, list[float]]]:
    """Per-call ns of every workload, and construction ns, for both modes, interleaved."""
    samples: Samples = defaultdict(list)
    construct: dict[bool, list[float]] = defaultdict(list)
    workloads = cpu_workloads()
    for package in interleaved(config.repeats):
        with patched(package):
            for name, fn, args in workloads:
                compiled = torch.compile(fn, backend="eager")
                warm_up(compiled, args, config.calls)
                samples[name, package].append(per_call_ns(compiled, args, config.calls))
        construct[package].append(construct_ns(config.calls, simulated=package))
    return samples, construct


def _per_object_row(us: dict[tuple[str, bool], float], construct_us: float) -> Row:
    """(b - a - construct) / 2: what each graph-created object costs beyond being built."""
    a, b = (name for name, _, _ in cpu_workloads()[:2])
    native, package = ((us[b, p] - us[a, p] - construct_us) / 2 for p in MODES)
    return Row(
        BENCH,
        "b - a - construct, per object",
        native,
        package,
        "us",
        target=f"package <= {MAX_US_PER_OBJECT:g} us",
        ok=package <= MAX_US_PER_OBJECT,
        details={"construct_us": construct_us, "construct": "torch.Stream + torch.Event"},
    )


def never_installed_row(config: Config) -> Row:
    """(a) against a child process that timed native before ever importing the package."""
    case = "a: x + 1 vs never-installed (child)"
    command = [sys.executable, "-m", "benchmarks.pristine"]
    command += ["--calls", str(config.calls), "--repeats", str(config.repeats)]
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired as exc:
        return Row(BENCH, case, None, None, "us", details={"error": repr(exc)})
    except (ValueError, IndexError) as exc:
        details = {"error": repr(exc), "stderr": done.stderr[-4000:]}
        return Row(BENCH, case, None, None, "us", details=details)
    native = ns_to_us(median(result["never_installed"]))
    package = ns_to_us(median(result["package"]))
    return ratio_row(BENCH, case, native, package, "us", MAX_STREAM_FREE_RATIO, result)


def run(config: Config) -> list[Row]:
    samples, construct = _sample_all(config)
    us = {key: ns_to_us(median(values)) for key, values in samples.items()}
    rows = []
    for i, (name, _, _) in enumerate(cpu_workloads()):
        ns = {"native_ns": samples[name, False], "package_ns": samples[name, True]}
        limit = MAX_STREAM_FREE_RATIO if i == 0 else None
        rows.append(ratio_row(BENCH, name, us[name, False], us[name, True], "us", limit, ns))
    rows.append(never_installed_row(config))
    native_construct, sim_construct = (ns_to_us(median(construct[p])) for p in MODES)
    case = "construct stream+event (loop)"
    types = {"native": "torch.Stream + torch.Event", "package": "SimStream + SimEvent"}
    rows.append(ratio_row(BENCH, case, native_construct, sim_construct, "us", None, types))
    rows.append(_per_object_row(us, native_construct))
    return rows
