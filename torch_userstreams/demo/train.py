"""The training runs the demo compares: eager (the reference), package, native.

Every run builds the model from the same seed and trains on the same batches with the same
optimizer, so any difference in loss or gradients comes from how the model was executed.
A compiled run that fails is reported (that is what ``--compare-native`` is for), not raised.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..compile.graph_compile import collecting_tables
from ..compile.table import UserObjectTable
from ..patch.install import session
from ..testing.objects import live_user_objects
from .alternating import alternating_ratio
from .config import DemoConfig
from .model import Batch, ForwardAndLoss, build_model, simulated_objects
from .progress import ProgressBar

LossOf = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, y) -> loss
MAX_REASON = 200


@dataclass
class RunResult:
    """What one training run produced; ``error`` is set when it stopped early."""

    name: str
    compiled: bool
    losses: list[float] = field(default_factory=list)
    grads: list[torch.Tensor] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    live_start: int = 0
    live_after_first: int | None = None  # after step 1: compiled, one call's objects bound
    live_end: int = 0
    tables: list[UserObjectTable] = field(default_factory=list)
    # Over eager, from blocks of steps taking turns (``alternating``); None when not measured.
    speedup: float | None = None
    error: str | None = None
    error_traceback: str | None = None

    @property
    def compile_s(self) -> float | None:
        """The first compiled step's time: tracing and compiling forward and backward."""
        return self.step_seconds[0] if self.compiled and self.step_seconds else None

    @property
    def steps_per_s(self) -> float | None:
        """Steady-state speed: every step after the first (which compiles or warms up)."""
        steady = self.step_seconds[1:] or self.step_seconds
        total = sum(steady)
        return len(steady) / total if total > 0 else None


def failure_reason(exc: BaseException) -> str:
    """One line: the exception type and its message up to Dynamo's boilerplate hint."""
    lines = []
    for line in str(exc).splitlines():
        if line.startswith("Set TORCHDYNAMO_VERBOSE"):
            break
        if line.strip():
            lines.append(line.strip())
    reason = f"{type(exc).__name__}: {' '.join(lines)}".rstrip(": ")
    return reason if len(reason) <= MAX_REASON else reason[: MAX_REASON - 3] + "..."


def sgd_step(model: torch.nn.Module, loss_of: LossOf, lr: float) -> Callable[[Batch], None]:
    """One training step as the demo times it: the loss, its backward, an SGD update,
    and ``loss.item()`` (the device has finished when it returns)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step(batch: Batch) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(*batch)
        loss.backward()
        optimizer.step()
        loss.item()

    return step


def train(
    model: torch.nn.Module,
    loss_of: LossOf,
    batches: list[Batch],
    config: DemoConfig,
    result: RunResult,
) -> None:
    """SGD on ``model``'s parameters over ``batches``, with ``loss_of`` (the model and its
    loss, compiled or not), recording loss and wall time per step into ``result``."""
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    bar = ProgressBar(
        result.name,
        len(batches),
        enabled=config.progress,
        first_note="compiling" if result.compiled else "",
    )
    try:
        for done, (x, y) in enumerate(batches, 1):
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = loss_of(x, y)
            loss.backward()
            optimizer.step()
            result.losses.append(loss.item())  # syncs the device: the step has finished
            result.step_seconds.append(time.perf_counter() - start)
            if done == 1:
                result.live_after_first = live_user_objects()
            bar.update(done)
    finally:
        bar.close("failed" if len(result.losses) < len(batches) else "")
    result.grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def run_eager(config: DemoConfig, batches: list[Batch]) -> RunResult:
    """The reference: plain eager PyTorch (simulated stream objects on CPU)."""
    result = RunResult("eager", compiled=False)
    model = build_model(config.dim, config.blocks, config.device, config.seed)
    result.live_start = live_user_objects()
    with simulated_objects(config.device):
        train(model, ForwardAndLoss(model), batches, config, result)
    result.live_end = live_user_objects()
    return result


def run_compiled(config: DemoConfig, batches: list[Batch], package: bool) -> RunResult:
    """``torch.compile`` of the model and its loss (``ForwardAndLoss``) with the package's
    backend, or natively with the package uninstalled; the install state is restored and
    Dynamo reset afterwards."""
    backend = config.backend if package else config.native_backend
    kind = "package" if package else "native"
    result = RunResult(f"{kind} ({backend})", compiled=True)
    with session(package):
        model = build_model(config.dim, config.blocks, config.device, config.seed)
        result.live_start = live_user_objects()
        compiled = torch.compile(ForwardAndLoss(model), backend=backend)
        with collecting_tables() as tables:
            try:
                train(model, compiled, batches, config, result)
            except Exception as exc:  # reported side by side: the point of --compare-native
                result.error = failure_reason(exc)
                result.error_traceback = traceback.format_exc()
        result.tables = list(tables)
        result.live_end = live_user_objects()  # after the training steps, as eager's
        if result.error is None:
            result.speedup = _speedup(model, compiled, batches, config)
        del compiled
    return result


def _speedup(
    model: torch.nn.Module, compiled: LossOf, batches: list[Batch], config: DemoConfig
) -> float | None:
    """Compiled over eager from blocks of steps taking turns, after training (its losses
    and gradients are kept): a failure here leaves the speed unmeasured, not the run
    failed."""
    try:
        return alternating_ratio(
            sgd_step(model, ForwardAndLoss(model), config.lr),
            sgd_step(model, compiled, config.lr),
            batches,
            lambda: simulated_objects(config.device),
        )
    except Exception:
        return None
