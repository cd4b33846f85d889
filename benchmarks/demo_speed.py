"""The demo's training step: compiled with ``userstreams`` against eager, and its compile time
against Inductor's for the same model without streams.

* steps/s: blocks of demo training steps, eager, ``userstreams`` and (for reading the ratio)
  Inductor on the same model without streams taking turns in one process, each compiling the
  model with its loss (``ForwardAndLoss``) as the demo does; the ratio is the
  median over rounds of each round's compiled/eager. On CPU with one intra-op thread as the
  demo uses; on CUDA too when there is a GPU. The demo's own sequential runs (eager, then
  ``userstreams``; native Inductor too on CUDA) go in the details, with their errors.
* compile time: the first step (trace, compile forward and backward, run) of the model and
  its loss with streams under ``userstreams`` against the model without streams under
  ``inductor``; fresh compiles, Inductor's and AOTAutograd's caches off, alternating (ABBA).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator

import torch

import torch_userstreams
import torch_userstreams.patch.install
from torch_userstreams.backends.inductor_options import ONE_CALL_OPTION
from torch_userstreams.demo.config import DemoConfig
from torch_userstreams.demo.model import (
    Batch,
    ForwardAndLoss,
    build_model,
    make_batches,
    simulated_objects,
)
from torch_userstreams.demo.train import RunResult, run_compiled, run_eager
from torch_userstreams.testing.capture import no_compile_caches

from . import accelerator_step
from .config import Config
from .inductor_gap import call_cost_rows, compile_with_masks_recomputed, mask_rows
from .results import Row, ratio_row
from .timing import abba, median

BENCH = "demo"
MIN_SPEED_RATIO = 1.0  # compiled steps/s over eager steps/s
MAX_COMPILE_RATIO = 1.5  # userstreams compile over Inductor's without streams


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _config(device: torch.device, steps: int) -> DemoConfig:
    return DemoConfig(device=device, steps=steps, progress=False)


Step = Callable[[Batch], None]


def _trainer(model: torch.nn.Module, loss_of: Callable[..., torch.Tensor], lr: float) -> Step:
    """One SGD step of the demo's loop (``loss.item()`` waits for the device); ``loss_of``
    is the model and its loss, compiled or not."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)

    def step(batch: Batch) -> None:
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        optimizer.step()
        loss.item()

    return step


def _steps_per_s(step: Step, batches: list[Batch], device: torch.device, eager: bool) -> float:
    # Eager CPU events cannot record: eager runs the demo with simulated objects, as the demo
    # does; compiled steps must not see them (Dynamo would guard on the swapped classes).
    with simulated_objects(device) if eager else contextlib.nullcontext():
        start = time.perf_counter()
        for batch in batches:
            step(batch)
        return len(batches) / (time.perf_counter() - start)


INDUCTOR = "inductor, no streams"
MODEL_ONLY = "userstreams, model only"
REGIONS = "userstreams, regions"
MASKS_RECOMPUTED = "inductor, no streams, relu masks recomputed"


def interleaved_steps_per_s(config: DemoConfig, rounds: int, block: int) -> dict[str, list[float]]:
    """steps/s of blocks of ``block`` steps, eager / ``userstreams`` / Inductor on the model
    without streams taking turns (order reversed every round), in one process, each compiled
    with its loss as the demo compiles it. Three more contenders are for reading the ratio
    only: ``userstreams`` as regions (``one_call`` False: on CPU, one graph without streams;
    the default on 2.11); ``userstreams`` on the model alone, its loss eager (what the demo
    compiled before); and Inductor on the model without streams whose relu masks are
    recomputed in the backward instead of saved (``inductor_gap``).

    Timing the runs one after the other, as the demo does, compares eager in a fresh process
    with compiled steps taken right after compiling, in a process holding Inductor's
    millions of objects: on this machine the same eager run measured 675 us/step first and
    1,027 us/step after a compiled run. Taking turns puts both under the same conditions.
    """
    device = config.device
    batches = make_batches(block, config.batch, config.dim, device, config.seed)
    steps: dict[str, Step] = {}
    eager_model = build_model(config.dim, config.blocks, device, config.seed)
    steps["eager"] = _trainer(eager_model, ForwardAndLoss(eager_model), config.lr)
    package_model = build_model(config.dim, config.blocks, device, config.seed)
    steps["userstreams"] = _trainer(
        package_model,
        torch.compile(ForwardAndLoss(package_model), backend="userstreams"),
        config.lr,
    )
    as_regions = build_model(config.dim, config.blocks, device, config.seed)
    steps[REGIONS] = _trainer(
        as_regions,
        torch.compile(
            ForwardAndLoss(as_regions), backend="userstreams", options={ONE_CALL_OPTION: False}
        ),
        config.lr,
    )
    model_only = build_model(config.dim, config.blocks, device, config.seed)
    compiled_model = torch.compile(model_only, backend="userstreams")
    steps[MODEL_ONLY] = _trainer(model_only, ForwardAndLoss(compiled_model), config.lr)
    plain = build_model(config.dim, config.blocks, device, config.seed, streams=False)
    steps[INDUCTOR] = _trainer(
        plain, torch.compile(ForwardAndLoss(plain), backend="inductor"), config.lr
    )
    recomputed = build_model(config.dim, config.blocks, device, config.seed, streams=False)
    steps[MASKS_RECOMPUTED] = _trainer(
        recomputed, compile_with_masks_recomputed(ForwardAndLoss(recomputed)), config.lr
    )
    for name, step in steps.items():  # compile and warm up
        _steps_per_s(step, batches[:3], device, eager=name == "eager")
    samples: dict[str, list[float]] = {name: [] for name in steps}
    names = list(steps)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            samples[name].append(_steps_per_s(steps[name], batches, device, name == "eager"))
    return samples


def _ratios(samples: dict[str, list[float]], name: str) -> list[float]:
    return [s / e for s, e in zip(samples[name], samples["eager"], strict=True)]


def speed_rows(device: torch.device, steps: int, rounds: int) -> list[Row]:
    """The demo's own sequential runs (parity, errors, the CUDA native run), then the
    steps/s ratios from interleaved blocks."""
    config = _config(device, steps)
    batches = make_batches(config.steps, config.batch, config.dim, config.device, config.seed)
    runs: dict[str, RunResult] = {"eager": run_eager(config, batches)}
    runs["userstreams"] = run_compiled(config, batches, package=True)
    if device.type == "cuda":
        runs["native inductor"] = run_compiled(config, batches, package=False)
    details: dict[str, object] = {
        f"demo run, {name}": {"steps_per_s": run.steps_per_s, "error": run.error}
        for name, run in runs.items()
    }
    case = f"steps/s, {device.type}: userstreams over eager (interleaved blocks)"
    if runs["userstreams"].error is not None:
        return [
            Row(BENCH, case, runs["eager"].steps_per_s, None, "steps/s", ok=False, details=details)
        ]
    with torch_userstreams.patch.install.session():
        samples = interleaved_steps_per_s(config, rounds, block=max(10, steps // 6))
    details["blocks_steps_per_s"] = samples
    eager = median(samples["eager"])
    ratio = median(_ratios(samples, "userstreams"))

    def untargeted(name: str, what: str) -> Row:
        ratio = median(_ratios(samples, name))
        case = f"steps/s, {device.type}: {what}"
        return Row(BENCH, case, eager, median(samples[name]), "steps/s", ratio=ratio)

    return [
        untargeted(INDUCTOR, "inductor without streams over eager (reference)"),
        untargeted(MODEL_ONLY, "userstreams, model compiled without its loss (reference)"),
        untargeted(REGIONS, "userstreams as regions over eager (reference; one call on 2.12+)"),
        untargeted(MASKS_RECOMPUTED, "same, relu masks recomputed, over eager (diagnostic)"),
        Row(
            BENCH,
            case,
            eager,
            median(samples["userstreams"]),
            "steps/s",
            ratio=ratio,
            target=f">= {MIN_SPEED_RATIO:g}x",
            ok=ratio >= MIN_SPEED_RATIO,
            details=details,
        ),
    ]


def first_step_s(config: DemoConfig, streams: bool) -> float:
    """Seconds for the first training step: trace, compile forward and backward, run."""
    torch._dynamo.reset()
    backend = "userstreams" if streams else "inductor"
    x, y = make_batches(1, config.batch, config.dim, config.device, config.seed)[0]
    model = build_model(config.dim, config.blocks, config.device, config.seed, streams=streams)
    compiled = torch.compile(ForwardAndLoss(model), backend=backend)
    start = time.perf_counter()
    compiled(x, y).backward()
    if config.device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    torch._dynamo.reset()
    return elapsed


def compile_rows(device: torch.device, repeats: int) -> list[Row]:
    config = _config(device, 1)
    samples: dict[bool, list[float]] = {False: [], True: []}
    with no_compile_caches():
        first_step_s(config, streams=False)  # lazy imports and first-use costs, discarded
        first_step_s(config, streams=True)
        for pair in abba(False, True, repeats):
            for streams in pair:
                samples[streams].append(first_step_s(config, streams))
    inductor, userstreams = median(samples[False]), median(samples[True])
    details = {"inductor_no_streams_s": samples[False], "userstreams_s": samples[True]}
    case = f"compile (first step), {device.type}: userstreams over inductor without streams"
    return [ratio_row(BENCH, case, inductor, userstreams, "s", MAX_COMPILE_RATIO, details)]


def run(config: Config) -> list[Row]:
    steps = 60 if config.calls <= 2_000 else 150
    rounds = 8 if config.calls <= 2_000 else 16
    rows: list[Row] = []
    was_installed = torch_userstreams.is_installed()
    with one_thread():
        devices = [torch.device("cpu")]
        if torch.cuda.is_available():
            devices.append(torch.device("cuda"))
        for device in devices:
            rows.extend(speed_rows(device, steps, rounds))
            if device.type == "cpu":
                rows.extend(mask_rows())
                rows.extend(call_cost_rows(rounds // 2))
                rows.extend(accelerator_step.rows(rounds, block=max(10, steps // 3)))
                rows.extend(accelerator_step.host_calls_rows(20))
                rows.extend(accelerator_step.compile_rows(config.compile_repeats))
            torch_userstreams.install()
            rows.extend(compile_rows(device, config.compile_repeats))
    if not was_installed:
        torch_userstreams.uninstall()
    return rows
