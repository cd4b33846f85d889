"""Per-call cost of a compiled call, package vs native, in the same process.

The package replaces native's global user-object table with a per-call binding; these
numbers check that this costs nothing for graphs without streams (a) and little per object
beyond constructing the objects themselves (b), or per input stream (c).

How it is timed. Each session compiles a fresh copy of every workload with the package
uninstalled (native) and another copy with it installed (package); frames compiled before
``install()`` keep native's mechanism, so both live side by side. The session then times
short chunks of calls, native and package alternately (ABBA), so that noise from the rest
of the machine, which comes in bursts, hits both sides of a pair alike. A ratio is the
median over all pairs of package/native; a time is the fastest chunk seen.

Whole calls include Dynamo's guard check, which differs between (a) and (b) (guards on
``torch.Stream``/``torch.Event``) and which neither mode's user-object layer controls. So the
per-object cost is measured on the frame body: the bytecode Dynamo generated, called
directly, which is the prologue, the graph call and the graph's lookups, nothing else.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import torch_userstreams
from torch_userstreams.compile import factories

from .config import Config
from .modes import MODES, mode_name
from .results import Row, ratio_row
from .timing import CHUNK_CALLS, abba, median, ns_to_us, per_call_ns, warm_up
from .workloads import cpu_workloads, fresh_copy

BENCH = "overhead"
MAX_STREAM_FREE_RATIO = 1.02
MAX_RATIO_WITH_OBJECTS = 1.0  # (b) and (c): no slower than native
MAX_US_PER_OBJECT = 1.0
REPO_ROOT = Path(__file__).resolve().parent.parent
BODY_CALLS_FACTOR = 3  # a frame body is ~3x faster than a whole call: more calls per chunk

Fn = Callable[..., Any]


def _construct_two(make_stream: Fn, make_event: Fn) -> None:
    make_stream()
    make_event()


def _nothing(make_stream: Fn, make_event: Fn) -> None:
    pass


def constructors(package: bool) -> tuple[Fn, Fn]:
    """How each mode builds (b)'s stream and event per call: native calls the constructors
    as written; the package calls the factories its prologue calls (simulator types on CPU,
    the device parsed once)."""
    if package:
        cpu = {"device": "cpu"}
        stream = factories.factory_for(torch.Stream(device="cpu"), (), cpu)
        return stream, factories.factory_for(torch.Event(device="cpu"), (), cpu)
    stream, event = (functools.partial(cls, device="cpu") for cls in (torch.Stream, torch.Event))
    return stream, event


def frame_body(fn: Fn) -> Fn:
    """The code Dynamo generated for ``fn`` (its only cache entry) as a plain function:
    calling it runs the frame without the guard check or the eval-frame callback."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = _debug_get_cache_entry_list(fn.__code__)
    if len(entries) != 1:
        raise RuntimeError(f"{fn.__name__} has {len(entries)} compiled entries, expected 1")
    return types.FunctionType(entries[0].code, fn.__globals__, fn.__name__)


@dataclass
class Subject:
    """One thing timed in both modes: a callable per mode, their args, calls per chunk."""

    name: str
    native: Fn
    package: Fn
    args: tuple[Any, ...]
    chunk: int

    def side(self, package: bool) -> Fn:
        return self.package if package else self.native


def _compile_copy(fn: Fn, args: tuple[Any, ...], calls: int) -> tuple[Fn, Fn]:
    """A fresh compiled copy of ``fn`` in the current mode, warmed up, and its frame body."""
    copy = fresh_copy(fn)
    compiled = torch.compile(copy, backend="eager")
    warm_up(compiled, args, calls)
    return compiled, frame_body(copy)


def _session_subjects(calls: int) -> list[Subject]:
    """Compile every workload in both modes; leaves the package installed."""
    compiled: dict[bool, list[tuple[Fn, Fn]]] = {}
    for package in MODES:
        if package:
            torch_userstreams.install()
        else:
            torch_userstreams.uninstall()
        compiled[package] = [_compile_copy(fn, args, calls) for _, fn, args in cpu_workloads()]
    chunk = min(CHUNK_CALLS, calls)
    body_chunk = chunk * BODY_CALLS_FACTOR
    subjects = []
    for i, (name, _, args) in enumerate(cpu_workloads()):
        (native_call, native_body), (package_call, package_body) = (compiled[p][i] for p in MODES)
        subjects.append(Subject(name, native_call, package_call, args, chunk))
        subjects.append(Subject(f"body {name}", native_body, package_body, args, body_chunk))
    native_makers, package_makers = (constructors(p) for p in MODES)
    for label, fn in (("construct", _construct_two), ("empty call", _nothing)):
        native = functools.partial(fn, *native_makers)
        package = functools.partial(fn, *package_makers)
        subjects.append(Subject(label, native, package, (), body_chunk))
    return subjects


Round = dict[tuple[str, bool], float]  # (subject, package?) -> per-call ns of one chunk


def _time_round(subjects: list[Subject], order: tuple[bool, bool]) -> Round:
    """One chunk of every subject in each mode, the two modes of a subject back to back."""
    return {
        (subject.name, p): per_call_ns(subject.side(p), subject.args, subject.chunk)
        for subject in subjects
        for p in order
    }


@dataclass
class Timings:
    """Every round of every session. Rounds are short, so a noise burst slows everything in
    a round alike: statistics compare values *within* a round, then take the median."""

    rounds: list[Round]

    def ratio(self, name: str) -> float:
        """Median over rounds of package / native."""
        return median([r[name, True] / r[name, False] for r in self.rounds])

    def fastest_us(self, name: str, package: bool) -> float:
        """The fastest chunk seen: the closest to the code's own cost (as timeit advises)."""
        return ns_to_us(min(r[name, package] for r in self.rounds))

    def relative(self, measure: Callable[[Round], float]) -> float:
        return median([measure(r) for r in self.rounds])


def measure(config: Config) -> Timings:
    """``config.repeats`` sessions (fresh compiles) of ``calls // CHUNK_CALLS`` rounds."""
    rounds: list[Round] = []
    for _ in range(config.repeats):
        torch._dynamo.reset()
        try:
            subjects = _session_subjects(config.calls)
            orders = abba(*MODES, max(2, config.calls // CHUNK_CALLS))
            rounds.extend(_time_round(subjects, order) for order in orders)
        finally:
            torch_userstreams.uninstall()
            torch._dynamo.reset()
    return Timings(rounds)


def construct_us(timings: Timings, package: bool) -> float:
    """Building (b)'s two objects the way ``package`` mode does, less the call around it."""
    return timings.fastest_us("construct", package) - timings.fastest_us("empty call", package)


def per_object_us(timings: Timings, package: bool, prefix: str = "body ") -> float:
    """(b - a - construct) / 2: what each graph-created object costs beyond being built.

    Computed within each round as a fraction of (a)'s time in that round (noise scales both),
    the median of that over rounds, times (a)'s fastest time.
    """
    a, b = (prefix + name for name, _, _ in cpu_workloads()[:2])

    def fraction_of_a(r: Round) -> float:
        construct = r["construct", package] - r["empty call", package]
        return (r[b, package] - r[a, package] - construct) / r[a, package]

    return timings.fastest_us(a, package) * timings.relative(fraction_of_a) / 2


def _per_object_row(timings: Timings) -> Row:
    """Per object on frame bodies, each mode's construction as it does it
    (``constructors``). The same on whole calls, guards included, is in the details."""
    native, package = (per_object_us(timings, p) for p in MODES)
    details = {
        "construct_us": {mode_name(p): construct_us(timings, p) for p in MODES},
        "fastest_body_us": {
            f"{name} / {mode_name(p)}": timings.fastest_us(f"body {name}", p)
            for name, _, _ in cpu_workloads()
            for p in MODES
        },
        "whole_call_per_object_us": {mode_name(p): per_object_us(timings, p, "") for p in MODES},
    }
    return Row(
        BENCH,
        "b - a - construct, per object (frame body)",
        native,
        package,
        "us",
        target=f"package <= {MAX_US_PER_OBJECT:g} us",
        ok=package <= MAX_US_PER_OBJECT,
        details=details,
    )


def _paired_row(timings: Timings, name: str, max_ratio: float | None) -> Row:
    """Times are the fastest chunks; the ratio is the median of the rounds' ratios."""
    native, package = (timings.fastest_us(name, p) for p in MODES)
    ratio = timings.ratio(name)
    pairs = [(r[name, False], r[name, True]) for r in timings.rounds]
    row = ratio_row(BENCH, name, native, package, "us", max_ratio, {"round_ns": pairs})
    row.ratio = ratio
    row.ok = None if max_ratio is None else ratio <= max_ratio
    return row


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
    pairs = result["pairs_ns"]
    native, package = (ns_to_us(min(pair[i] for pair in pairs)) for i in (0, 1))
    row = ratio_row(BENCH, case, native, package, "us", MAX_STREAM_FREE_RATIO, result)
    row.ratio = median([p / n for n, p in pairs])  # paired, as in the parent
    row.ok = row.ratio <= MAX_STREAM_FREE_RATIO
    return row


def run(config: Config) -> list[Row]:
    timings = measure(config)
    rows = []
    for i, (name, _, _) in enumerate(cpu_workloads()):
        limit = MAX_STREAM_FREE_RATIO if i == 0 else MAX_RATIO_WITH_OBJECTS
        rows.append(_paired_row(timings, name, limit))
    rows.append(never_installed_row(config))
    native, package = (construct_us(timings, p) for p in MODES)
    kinds = {"native": "torch.Stream + torch.Event", "package": "the prologue's factories"}
    rows.append(ratio_row(BENCH, "construct stream+event", native, package, "us", None, kinds))
    rows.append(_per_object_row(timings))
    return rows
