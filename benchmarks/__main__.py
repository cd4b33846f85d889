"""``python -m benchmarks [--quick] [--json PATH] [--calls N] [--repeats N]``.

Runs every benchmark, prints one table row per measurement and writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch_userstreams
from torch_userstreams.demo.cli import output_problem

from . import compile_time, cuda, demo_speed, distributed, live_objects, overhead
from .config import Config
from .results import Row, table, write_json

DEFAULT_JSON = Path(__file__).resolve().parent / "results-latest.json"

BENCHMARKS: tuple[tuple[str, Callable[[Config], list[Row]]], ...] = (
    ("overhead", overhead.run),
    ("live_objects", live_objects.run),
    ("compile_time", compile_time.run),
    ("cuda", cuda.run),
    ("demo", demo_speed.run),
    ("distributed", distributed.run),
)


def run_all(config: Config) -> list[Row]:
    """Every benchmark in order; the process is left unpatched whatever happens.

    Each benchmark's rows also go to stderr as soon as it finishes, so a run stopped by a
    time limit (a GPU lease, say) keeps the numbers measured before it.
    """
    rows: list[Row] = []
    try:
        for name, bench in BENCHMARKS:
            start = time.perf_counter()
            done = bench(config)
            rows.extend(done)
            took = time.perf_counter() - start
            print(f"{name}: {took:.1f} s\n{table(done)}", file=sys.stderr, flush=True)
    finally:
        torch_userstreams.uninstall()
    return rows


def config_from(args: argparse.Namespace) -> Config:
    config = Config.quick() if args.quick else Config()
    if args.calls is not None:
        config = dataclasses.replace(config, calls=args.calls)
    if args.repeats is not None:
        config = dataclasses.replace(config, repeats=args.repeats, compile_repeats=args.repeats)
    return config


def positive(text: str) -> int:
    """A count of calls or samples: zero would time nothing and divide by zero later."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be 1 or more")
    return value


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, with the JSON path checked now: the rows are written after minutes."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer calls and repeats")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write rows")
    parser.add_argument("--calls", type=positive, help="timed calls per sample, live-object calls")
    parser.add_argument("--repeats", type=positive, help="samples per mode (median reported)")
    args = parser.parse_args(argv)
    problem = output_problem("--json", args.json)
    if problem:
        parser.error(problem)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    start = time.perf_counter()
    rows = run_all(config_from(args))
    print(table(rows))
    write_json(rows, args.json)
    missed = [f"{r.benchmark}/{r.case}" for r in rows if r.ok is False]
    print(f"\n{len(rows)} rows in {time.perf_counter() - start:.1f} s; JSON: {args.json}")
    if missed:
        print("targets missed: " + "; ".join(missed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
