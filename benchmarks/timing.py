"""Per-call timing. Imports only torch: the never-installed child process uses it too."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def warm_up(fn: Callable[..., Any], args: tuple[Any, ...], calls: int) -> None:
    """Compile and settle caches before timing, so no sample pays for a (re)compile."""
    for _ in range(max(20, calls // 10)):
        fn(*args)


def per_call_ns(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    calls: int,
    sync: Callable[[], Any] | None = None,
) -> float:
    """Mean ns per call over ``calls`` calls, gc paused so a collection is not billed to fn."""
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn(*args)
        if sync is not None:
            sync()
        return (time.perf_counter_ns() - start) / calls
    finally:
        if gc_was_enabled:
            gc.enable()


# Calls per timed chunk: a few ms, so that chunks compared with each other run close
# together in time and machine noise (which comes in bursts) hits them alike.
CHUNK_CALLS = 250


def abba(first: T, second: T, rounds: int) -> Iterator[tuple[T, T]]:
    """``rounds`` pairs, ``first`` leading on even rounds and ``second`` on odd ones, so
    that a drift in machine speed favours neither side."""
    for r in range(rounds):
        yield (first, second) if r % 2 == 0 else (second, first)


def median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


def ns_to_us(ns: float) -> float:
    return ns / 1_000.0
