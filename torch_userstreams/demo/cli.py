"""Command line of the demo: parse, train eager and compiled, print the summary, draw."""

from __future__ import annotations

import argparse
import sys
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
    parser.add_argument("--steps", type=int, default=DemoConfig.steps, help="training steps")
    parser.add_argument("--backend", choices=BACKENDS, default=DemoConfig.backend)
    parser.add_argument(
        "--seed", type=int, default=DemoConfig.seed, help="weights and data (same for all runs)"
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
        "--threads",
        type=int,
        default=1,
        help="CPU intra-op threads while training (default 1: the model is tiny, more threads "
        "only add noise); 0 keeps torch's setting",
    )
    parser.add_argument(
        "--distributed",
        action="store_true",
        help="under torchrun: train with DistributedDataParallel on every rank, compiled and "
        "eager (gloo on CPU, NCCL with one GPU per rank); rank 0 prints the summary",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def config_from(args: argparse.Namespace, parser: argparse.ArgumentParser) -> DemoConfig:
    """Validate before training, so a bad option fails in a second, not after a minute."""
    from .render import can_render

    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.threads < 0:
        parser.error("--threads must be 0 (torch's setting) or more")
    try:
        device = resolve_device(args.device)
    except ValueError as exc:
        parser.error(str(exc))
    if args.timeline is not None:
        problem = can_render(args.timeline)
        if problem:
            parser.error(problem)
    return DemoConfig(
        device=device,
        steps=args.steps,
        backend=args.backend,
        seed=args.seed,
        compare_native=args.compare_native,
        timeline=args.timeline,
        progress=not args.no_progress,
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
    if config.timeline is not None:
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
    print(f"\ndemo wall time: {time.perf_counter() - start:.1f} s", file=out)
    eager, package = runs[0], runs[1]
    return 0 if report.parity_ok(package, eager, config.parity_tolerance) else 1
