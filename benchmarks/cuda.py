"""CUDA microbenchmarks: side-stream overlap and per-call overhead, package vs native.

Streams exist to overlap work, so (i) times a host-to-device copy on a side stream against
a matmul on the main stream: achieved / ideal, where ideal is max(copy alone, matmul
alone) and 1.0 means full overlap. (ii) repeats the stream-free per-call check with
Inductor on a GPU. Without a CUDA device everything is skipped.
"""

from __future__ import annotations

import sys
import traceback
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from .config import Config
from .modes import MODES, interleaved, mode_name, patched
from .results import Row, ratio_row
from .timing import median, ns_to_us, per_call_ns, warm_up
from .workloads import stream_free

BENCH = "cuda"
MATMUL_N = 4096
COPY_ELEMENTS = 16 * 1024 * 1024  # 64 MiB of float32, pinned, so the copy is async
MAX_STREAM_FREE_RATIO = 1.02
MAX_OVERLAP = 1.05  # userstreams: compiled time / max(copy, matmul)
SAMPLES = 3


def overlapped(
    a: torch.Tensor, b: torch.Tensor, host: torch.Tensor, side: torch.Stream
) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy on ``side`` while the matmul runs on the current stream, then join."""
    with side:
        dev = host.to(a.device, non_blocking=True)
    c = a @ b
    torch.cuda.current_stream().wait_stream(side)
    return c, dev


def _copy_only(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    return host.to(device, non_blocking=True)


def _matmul_only(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def gpu_ms(fn: Callable[..., Any], args: tuple[Any, ...], iters: int) -> float:
    """Median over SAMPLES of the mean GPU ms per call, timed by events on the main stream."""
    samples = []
    for _ in range(SAMPLES):
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(*args)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / iters)
    return median(samples)


def _compiled_ms(package: bool, args: tuple[Any, ...], iters: int, backend: str) -> float:
    with patched(package):
        return gpu_ms(torch.compile(overlapped, backend=backend), args, iters)


def overlap_rows(config: Config) -> list[Row]:
    device = torch.device("cuda")
    a = torch.randn(MATMUL_N, MATMUL_N, device=device)
    b = torch.randn(MATMUL_N, MATMUL_N, device=device)
    host = torch.ones(COPY_ELEMENTS, pin_memory=True)
    side = torch.cuda.Stream()
    args = (a, b, host, side)
    copy = gpu_ms(_copy_only, (host, device), config.cuda_iters)
    matmul = gpu_ms(_matmul_only, (a, b), config.cuda_iters)
    ideal = max(copy, matmul)
    ms: dict[str, float] = {"copy": copy, "matmul": matmul, "ideal": ideal}
    ms["eager"] = gpu_ms(overlapped, args, config.cuda_iters)
    errors: dict[str, str] = {}
    runs = [(mode_name(mode), mode, "inductor") for mode in MODES]
    runs.append(("userstreams", True, "userstreams"))
    for name, mode, backend in runs:
        try:
            ms[name] = _compiled_ms(mode, args, config.cuda_iters, backend)
        except Exception:  # a failing mode is reported, and the others still measured
            errors[name] = traceback.format_exc()
            print(errors[name], file=sys.stderr)
    details: dict[str, Any] = {"ms": ms, "errors": errors}
    rows = [Row(BENCH, "overlap time/ideal, eager", ms["eager"] / ideal, None, "x")]
    rows.append(_userstreams_overlap_row(ms, ideal, details))
    case = "overlap time/ideal, inductor"
    if errors:
        native = ms["native"] / ideal if "native" in ms else None
        package = ms["package"] / ideal if "package" in ms else None
        rows.append(Row(BENCH, case, native, package, "x", target="error", details=details))
    else:
        native, package = ms["native"] / ideal, ms["package"] / ideal
        rows.append(ratio_row(BENCH, case, native, package, "x", details=details))
    return rows


def _userstreams_overlap_row(ms: dict[str, float], ideal: float, details: dict[str, Any]) -> Row:
    """Overlap with the package's backend (regions on their streams), against native
    Inductor; the target is on the package's own time/ideal."""
    case = "overlap time/ideal, userstreams vs native inductor"
    native = ms["native"] / ideal if "native" in ms else None
    if "userstreams" not in ms:
        return Row(BENCH, case, native, None, "x", target="error", ok=False, details=details)
    package = ms["userstreams"] / ideal
    ratio = package / native if native else None
    ok = package <= MAX_OVERLAP
    target = f"package <= {MAX_OVERLAP:g}"
    return Row(BENCH, case, native, package, "x", ratio, target, ok, details=details)


def overhead_rows(config: Config) -> list[Row]:
    x = torch.ones(4, device="cuda")
    samples: dict[bool, list[float]] = defaultdict(list)
    for mode in interleaved(min(config.repeats, 5)):
        with patched(mode):
            compiled = torch.compile(stream_free, backend="inductor")
            warm_up(compiled, (x,), config.calls)
            ns = per_call_ns(compiled, (x,), config.calls, sync=torch.cuda.synchronize)
            samples[mode].append(ns)
    native, package = (ns_to_us(median(samples[p])) for p in MODES)
    details = {"native_ns": samples[False], "package_ns": samples[True]}
    case = "a: x + 1 per call, inductor"
    return [ratio_row(BENCH, case, native, package, "us", MAX_STREAM_FREE_RATIO, details)]


def run(config: Config) -> list[Row]:
    if not torch.cuda.is_available():
        print("cuda: skipped: no CUDA device")
        return [Row(BENCH, "skipped: no CUDA device", None, None, "", skipped=True)]
    rows = []
    for bench in (overlap_rows, overhead_rows):
        try:
            rows.extend(bench(config))
        except Exception:  # untestable without a GPU: report, don't lose the other numbers
            error = traceback.format_exc()
            print(error, file=sys.stderr)
            case = f"{bench.__name__}: error"
            rows.append(Row(BENCH, case, None, None, "", ok=False, details={"error": error}))
    return rows
