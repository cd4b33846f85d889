"""The demo's training step: compiled with ``userstreams`` against eager, and its compile time
against Inductor's for the same model without streams.

* steps/s: ``python -m torch_userstreams.demo``'s runs (eager, then ``userstreams``), on CPU
  with one intra-op thread as the demo uses; on CUDA too when there is a GPU, with native
  Inductor beside them. Also, for reading the CPU ratio: plain Inductor on the same model
  without streams (what Inductor itself does at this size).
* compile time: the first step (trace, compile forward and backward, run) of the model with
  streams under ``userstreams`` against the model without streams under ``inductor``; fresh
  compiles, Inductor's and AOTAutograd's caches off, alternating (ABBA).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch
import torch.nn.functional as F

import torch_userstreams
from torch_userstreams.demo.config import DemoConfig
from torch_userstreams.demo.model import build_model, make_batches
from torch_userstreams.demo.train import RunResult, run_compiled, run_eager

from .config import Config
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


def plain_inductor_steps_per_s(config: DemoConfig) -> float | None:
    """Inductor on the demo model without streams: steady-state steps/s."""
    batches = make_batches(config.steps, config.batch, config.dim, config.device, config.seed)
    model = build_model(config.dim, config.blocks, config.device, config.seed, streams=False)
    compiled = torch.compile(model, backend="inductor")
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    seconds = []
    try:
        for x, y in batches:
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            F.mse_loss(compiled(x), y).backward()
            optimizer.step()
            if config.device.type == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
    finally:
        torch._dynamo.reset()
    steady = seconds[1:]
    return len(steady) / sum(steady) if steady else None


def speed_rows(device: torch.device, steps: int) -> list[Row]:
    config = _config(device, steps)
    batches = make_batches(config.steps, config.batch, config.dim, config.device, config.seed)
    eager = run_eager(config, batches)
    package = run_compiled(config, batches, package=True)
    runs: dict[str, RunResult] = {"eager": eager, "userstreams": package}
    if device.type == "cuda":
        runs["native inductor"] = run_compiled(config, batches, package=False)
    details = {
        name: {"steps_per_s": run.steps_per_s, "compile_s": run.compile_s, "error": run.error}
        for name, run in runs.items()
    }
    plain = plain_inductor_steps_per_s(config)
    details["plain inductor, no streams"] = {"steps_per_s": plain}
    case = f"steps/s, {device.type}: userstreams over eager"
    if package.error is not None or eager.steps_per_s is None or package.steps_per_s is None:
        return [Row(BENCH, case, eager.steps_per_s, None, "steps/s", ok=False, details=details)]
    ratio = package.steps_per_s / eager.steps_per_s
    reference = Row(
        BENCH,
        f"steps/s, {device.type}: inductor without streams over eager (reference)",
        eager.steps_per_s,
        plain,
        "steps/s",
        ratio=None if plain is None else plain / eager.steps_per_s,
    )
    return [
        reference,
        Row(
            BENCH,
            case,
            eager.steps_per_s,
            package.steps_per_s,
            "steps/s",
            ratio=ratio,
            target=f">= {MIN_SPEED_RATIO:g}x",
            ok=ratio >= MIN_SPEED_RATIO,
            details=details,
        ),
    ]


@contextlib.contextmanager
def no_compile_caches() -> Iterator[None]:
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with (
        functorch_config.patch(enable_autograd_cache=False),
        inductor_config.patch(fx_graph_cache=False),
    ):
        yield


def first_step_s(config: DemoConfig, streams: bool) -> float:
    """Seconds for the first training step: trace, compile forward and backward, run."""
    torch._dynamo.reset()
    backend = "userstreams" if streams else "inductor"
    x, y = make_batches(1, config.batch, config.dim, config.device, config.seed)[0]
    model = build_model(config.dim, config.blocks, config.device, config.seed, streams=streams)
    compiled = torch.compile(model, backend=backend)
    start = time.perf_counter()
    F.mse_loss(compiled(x), y).backward()
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
    rows: list[Row] = []
    was_installed = torch_userstreams.is_installed()
    with one_thread():
        devices = [torch.device("cpu")]
        if torch.cuda.is_available():
            devices.append(torch.device("cuda"))
        for device in devices:
            rows.extend(speed_rows(device, steps))
            torch_userstreams.install()
            rows.extend(compile_rows(device, config.compile_repeats))
    if not was_installed:
        torch_userstreams.uninstall()
    return rows
