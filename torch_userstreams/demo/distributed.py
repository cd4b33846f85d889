"""``--distributed``: the demo model trained with DistributedDataParallel, compiled and eager.

    torchrun --nproc-per-node 2 -m torch_userstreams.demo --distributed

Every rank trains its copy twice from the same seed on its own batches: eager DDP (the
reference) and ``torch.compile(DDP(model))`` with the package's backend. Dynamo's DDP
optimizer splits the frame into one graph per gradient bucket (the model is sized for
several 1 MB buckets), and every graph's forward and backward must resolve the objects of
the call it belongs to. Rank 0 prints, over all ranks: parity with eager DDP, steps/s of
both, and the live streams and events of the compiled run. gloo on CPU; NCCL when each rank
has its own GPU (``--device cuda``, ``LOCAL_RANK`` picks it).
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, TextIO, cast

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ..patch.install import session
from ..testing.objects import live_user_objects
from .config import DemoConfig
from .model import ForwardAndLoss, build_model, make_batches, simulated_objects
from .report import grad_diff, loss_diff
from .train import RunResult, failure_reason, train

BUCKET_CAP_MB = 1  # DDP's first bucket is 1 MB; Dynamo's DDP optimizer wants none smaller
DIM, BLOCKS = 256, 4  # 2 MB of parameters: several buckets, so several graphs
LR = 0.001  # four residual blocks this wide diverge at the single-process demo's 0.05


@dataclass
class RankReport:
    """One rank's outcome (plain values: it travels between processes)."""

    rank: int
    graphs: int  # graphs compiled for the frame (one per bucket under the DDP optimizer)
    loss_diff: float | None
    grad_diff: float | None
    eager_steps_per_s: float | None
    compiled_steps_per_s: float | None
    live_growth: int | None  # live streams+events, end minus after step 1
    error: str | None = None


def distributed_config(config: DemoConfig) -> DemoConfig:
    return dataclasses.replace(config, dim=DIM, blocks=BLOCKS, lr=LR, progress=False)


def _ddp(config: DemoConfig, device: torch.device) -> DistributedDataParallel:
    model = build_model(config.dim, config.blocks, device, config.seed)
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids, bucket_cap_mb=BUCKET_CAP_MB)


def _counting(backend: str, counter: list[int]) -> Any:
    """The backend, counting the graphs it compiles (the DDP optimizer calls it per bucket)."""
    compile_graph = torch._dynamo.lookup_backend(backend)

    def count_and_compile(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        counter.append(1)
        return compile_graph(gm, example_inputs)

    return count_and_compile


def train_rank(rank: int, world_size: int, config: DemoConfig) -> RankReport:
    """Train eager and compiled DDP on this rank (its process group is initialized)."""
    config = distributed_config(config)
    device = config.device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    batches = make_batches(config.steps, config.batch, config.dim, device, config.seed + rank)
    eager = RunResult("eager DDP", compiled=False)
    ddp = _ddp(config, device)
    with simulated_objects(device):
        train(ddp, ForwardAndLoss(ddp), batches, config, eager)
    compiled = RunResult(f"compiled DDP ({config.backend})", compiled=True)
    graphs: list[int] = []
    with session(package=True):
        try:
            ddp = _ddp(config, device)
            # DDP compiled alone, as DDP users compile it: Dynamo splits its graph at the
            # gradient buckets; the loss runs eagerly after it, as in the eager run.
            forward = cast(
                torch.nn.Module, torch.compile(ddp, backend=_counting(config.backend, graphs))
            )
            train(ddp, ForwardAndLoss(forward), batches, config, compiled)
            compiled.live_end = live_user_objects()
        except Exception as exc:  # reported, like the single-process demo's failures
            compiled.error = failure_reason(exc)
    growth = None
    if compiled.live_after_first is not None and compiled.error is None:
        growth = compiled.live_end - compiled.live_after_first
    return RankReport(
        rank,
        len(graphs),
        loss_diff(compiled, eager),
        grad_diff(compiled, eager),
        eager.steps_per_s,
        compiled.steps_per_s,
        growth,
        compiled.error,
    )


def parity_ok(reports: list[RankReport], tolerance: float) -> bool:
    return all(
        r.error is None
        and r.loss_diff is not None
        and r.grad_diff is not None
        and max(r.loss_diff, r.grad_diff) <= tolerance
        for r in reports
    )


def summary(config: DemoConfig, reports: list[RankReport]) -> str:
    config = distributed_config(config)
    tolerance = config.parity_tolerance
    lines = [
        f"torch_userstreams distributed demo: {len(reports)} ranks, DDP "
        f"(bucket cap {BUCKET_CAP_MB} MB), {config.blocks} side-stream blocks (dim "
        f"{config.dim}), {config.steps} steps, backend {config.backend!r}, device "
        f"{config.device.type}, torch {torch.__version__}",
        "",
        "rank  graphs  max |loss - eager|  max |grad - eager|  eager steps/s  compiled "
        "steps/s  live growth after step 1",
    ]
    for r in reports:
        lines.append(
            f"{r.rank:<4}  {r.graphs:<6}  {_num(r.loss_diff, '.3e'):<18}  "
            f"{_num(r.grad_diff, '.3e'):<18}  {_num(r.eager_steps_per_s, '.1f'):<13}  "
            f"{_num(r.compiled_steps_per_s, '.1f'):<17}  {_num(r.live_growth, '+d')}"
            + (f"  FAILED: {r.error}" if r.error else "")
        )
    verdict = "OK" if parity_ok(reports, tolerance) else "EXCEEDED"
    ratios = [
        r.compiled_steps_per_s / r.eager_steps_per_s
        for r in reports
        if r.compiled_steps_per_s and r.eager_steps_per_s
    ]
    lines += [
        "",
        f"parity with eager DDP on every rank: {verdict} (tolerance {tolerance:g})",
        "compiled/eager steps/s: " + (", ".join(f"{x:.2f}x" for x in ratios) or "-"),
    ]
    return "\n".join(lines)


_NUMBERS: tuple[str, ...] = (
    "graphs",
    "loss_diff",
    "grad_diff",
    "eager_steps_per_s",
    "compiled_steps_per_s",
    "live_growth",
)


def gather(report: RankReport, device: torch.device, world_size: int) -> list[RankReport]:
    """Every rank's report, by rank, through one all_gather of numbers (object collectives
    need NumPy). A failed rank's message stays in its own output; here it is "failed"."""
    values = [getattr(report, name) for name in _NUMBERS] + [report.error is not None]
    row = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)
    rows = [torch.empty_like(row) for _ in range(world_size)]
    dist.all_gather(rows, row.to(device) if device.type == "cuda" else row)
    reports = []
    for rank, gathered in enumerate(rows):
        numbers = [None if math.isnan(v) else v for v in gathered.tolist()]
        fields: dict[str, Any] = dict(zip(_NUMBERS, numbers[:-1], strict=True))
        for name in ("graphs", "live_growth"):
            value = fields[name]
            fields[name] = None if value is None else int(value)
        error = "failed (see that rank's output)" if numbers[-1] else None
        reports.append(RankReport(rank=rank, error=error, **fields))  # type: ignore[arg-type]
    return reports


def _num(value: float | int | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def main(config: DemoConfig, out: TextIO) -> int:
    """Under torchrun: train on this rank, gather the reports, print them on rank 0."""
    backend = "nccl" if config.device.type == "cuda" else "gloo"
    dist.init_process_group(backend)
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        report = train_rank(rank, world_size, config)
        if report.error is not None:
            print(f"rank {rank}: compiled run failed: {report.error}", file=sys.stderr)
        reports = gather(report, config.device, world_size)
        if rank == 0:
            print(summary(config, reports), file=out)
        return 0 if parity_ok(reports, distributed_config(config).parity_tolerance) else 1
    finally:
        dist.destroy_process_group()
