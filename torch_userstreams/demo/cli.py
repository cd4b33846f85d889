"""Command line of the demo: parse, train eager and compiled, print the summary, draw."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import torch

from ..patch import install as patching
from . import report
from .config import BACKENDS, DemoConfig, resolve_device
from .model import make_batches
from .train import RunResult, run_compiled, run_eager

# The first step compiles, so steps/s and live growth are measured from step 2 on.
MIN_STEPS = 2
# Every step's batch is made up front (~17 KB each at dim 64, ~64 KB at the distributed
# demo's dim 256): 10k steps hold 170-650 MB per process, far more than a demo needs;
# 10**9 would run out of memory before the first step.
MAX_STEPS = 10_000
MAX_SEED = 2**63 - 1  # torch.manual_seed takes 64 bits; the data seed is seed + 1 (+ rank)
# Variables torch.distributed's env:// rendezvous reads; torchrun sets them all.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TORCHRUN = "torchrun --nproc-per-node N -m torch_userstreams.demo --distributed"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m torch_userstreams.demo",
        description="Train a small model whose blocks run a branch on a side stream, "
        "compiled with torch_userstreams, and compare it with eager (and native).",
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to train (default auto: CUDA when available, else CPU)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DemoConfig.steps,
        help=f"training steps, {MIN_STEPS}..{MAX_STEPS} (step 1 compiles and is not timed)",
    )
    parser.add_argument("--backend", choices=BACKENDS, default=DemoConfig.backend)
    parser.add_argument(
        "--seed",
        type=int,
        default=DemoConfig.seed,
        help="weights and data (same for all runs), 0..2**63-1",
    )
    parser.add_argument(
        "--compare-native",
        action="store_true",
        help="also train with native torch.compile streams support (package uninstalled)",
    )
    parser.add_argument(
        "--timeline",
        type=Path,
        metavar="OUT",
        help="draw one training step per stream: .svg always works, .png needs matplotlib",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        metavar="OUT",
        help="write the same step as a Chrome trace (JSON) that Perfetto and chrome://tracing "
        "open: profiler times on CUDA, program order on CPU",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU intra-op threads while training (default 1: the model is tiny, more threads "
        "only add noise), at most 4x the CPUs; 0 keeps torch's setting",
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="under torchrun: train with DistributedDataParallel on every rank, compiled and "
        "eager (gloo on CPU, NCCL with one GPU per rank); rank 0 prints the summary; "
        "not with --compare-native, --timeline or --trace",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    shown = parser.add_mutually_exclusive_group()
    shown.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print each graph's user-object table and what the passes did",
    )
    shown.add_argument(
        "-q", "--quiet", action="store_true", help="print the verdict only (parity, speed)"
    )
    return parser


def max_threads() -> int:
    """More threads than cores only add contention for this tiny model; 4x the cores leaves
    room for SMT and odd affinity while staying far from counts that crash OpenMP (10**6
    segfaults) or overflow a C int."""
    return 4 * (os.cpu_count() or 1)


def check_range(
    parser: argparse.ArgumentParser, option: str, value: int, low: int, high: int, why: str = ""
) -> None:
    """One line naming the option, the value and the allowed range, then exit 2."""
    if not low <= value <= high:
        parser.error(f"{option} {value}: must be in {low}..{high}{why}")


def _nearest_existing(path: Path) -> Path:
    """``path`` or its closest ancestor that is there, a broken symlink included (the writer
    creates the folders between, and fails on a name a dangling link already takes)."""
    while not os.path.lexists(path) and path != path.parent:
        path = path.parent
    return path


def _existing_problem(option: str, path: Path) -> str | None:
    """An existing regular file must open for writing; other files (/dev/null) are let be,
    since opening a FIFO to test it would block."""
    if path.is_dir():
        return f"{option} {path}: is a directory; give a file path"
    if path.is_file():
        try:
            path.open("ab").close()  # appends nothing: the file is left as it is
        except OSError as exc:
            return f"{option} {path}: cannot write this file ({exc.strerror})"
    return None


def _new_file_problem(option: str, path: Path) -> str | None:
    """A file to be made: the nearest folder that is there must take a new file."""
    folder = _nearest_existing(path.parent.absolute())
    if folder.is_symlink() and not folder.exists():
        return f"{option} {path}: {folder} is a broken symlink"
    if not folder.is_dir():
        return f"{option} {path}: {folder} is not a directory"
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-probe-"):
            pass  # access() says yes to root even where no file can be made (/proc)
    except OSError as exc:
        return f"{option} {path}: cannot create files in {folder} ({exc.strerror})"
    return None


def output_problem(option: str, path: Path) -> str | None:
    """None if a file can be written at ``path`` (parents made as needed), else why not:
    checked before a long run, which would otherwise fail only when it writes."""
    try:
        if path.is_symlink() and not path.exists():
            return f"{option} {path}: is a broken symlink (or a loop of them)"
        if path.exists():
            return _existing_problem(option, path)
        return _new_file_problem(option, path)
    except OSError as exc:  # a folder on the way that this user cannot search or write
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{option} {path}: cannot write there: {exc.strerror}{where}"


def _check_numbers(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    why = " (the first step compiles: steps/s are measured from step 2 on"
    why += f"; batches are made up front, so at most {MAX_STEPS})"
    check_range(parser, "--steps", args.steps, MIN_STEPS, MAX_STEPS, why)
    if args.threads != 0:
        why = f" (at most 4x this machine's {os.cpu_count()} CPUs), or 0 for torch's setting"
        check_range(parser, "--threads", args.threads, 1, max_threads(), why)
    check_range(parser, "--seed", args.seed, 0, MAX_SEED)


def _check_distributed(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--distributed needs torchrun's environment and does not draw or compare native."""
    if not args.distributed:
        return
    single = ("--compare-native", "--timeline", "--trace")
    given = (args.compare_native, args.timeline, args.trace)
    for option, value in zip(single, given, strict=True):
        if value:
            parser.error(f"{option} is not supported with --distributed; drop one of the two")
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    if missing:
        parser.error(
            f"--distributed: {', '.join(missing)} not set (torchrun sets them); "
            f"run it under `{TORCHRUN}`"
        )


def _check_outputs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """--timeline and --trace must be writable, and not one file (one would overwrite the
    other)."""
    from .render import can_render

    if args.timeline is not None:
        # Where it can be written first: a folder is not a file of an unknown format.
        problem = output_problem("--timeline", args.timeline) or can_render(args.timeline)
        if problem:
            parser.error(problem)
    if args.trace is not None:
        problem = output_problem("--trace", args.trace)
        if problem:
            parser.error(problem)
        if args.timeline is not None and args.timeline.absolute() == args.trace.absolute():
            parser.error(f"--timeline and --trace both name {args.trace}: give two files")


def config_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> DemoConfig:
    """Validate before training, so a bad option fails in a second, not after a minute."""
    _check_numbers(args, parser)
    _check_distributed(args, parser)
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))
    _check_outputs(args, parser)
    return DemoConfig(
        device=device,
        steps=args.steps,
        backend=args.backend,
        seed=args.seed,
        compare_native=args.compare_native,
        timeline=args.timeline,
        trace=args.trace,
        progress=not (args.no_progress or args.quiet),
        verbose=args.verbose,
        quiet=args.quiet,
        threads=args.threads or None,
        distributed=args.distributed,
    )


def run(config: DemoConfig, out: TextIO) -> list[RunResult]:
    """Train every run the config asks for, print the summary; [eager, package, native?]."""
    batches = make_batches(config.steps, config.batch, config.dim, config.device, config.seed)
    eager = run_eager(config, batches)
    compiled = [run_compiled(config, batches, package=True)]
    if config.compare_native:
        compiled.append(run_compiled(config, batches, package=False))
    print(report.summary(config, eager, compiled), file=out)
    if config.timeline is not None or config.trace is not None:
        from .draw import draw_step

        print(draw_step(config), file=out)
    return [eager, *compiled]


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the demo; 0 when the package run trained and matched eager within tolerance."""
    parser = build_parser()
    config = config_from(parser.parse_args(argv), parser)
    out = sys.stdout if out is None else out
    was_installed, threads = patching.is_installed(), torch.get_num_threads()
    start = time.perf_counter()
    try:
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        if config.distributed:
            from .distributed import main as distributed_main

            return distributed_main(config, out)
        runs = run(config, out)
    finally:
        torch.set_num_threads(threads)
        if was_installed:
            patching.install()
    if not config.quiet:
        print(f"\ndemo wall time: {time.perf_counter() - start:.1f} s", file=out)
    eager, package = runs[0], runs[1]
    return 0 if report.parity_ok(package, eager, config.parity_tolerance) else 1
