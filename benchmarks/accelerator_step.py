"""The demo's training step on the fake accelerator: what the package's accelerator path
costs the host, measurable on any machine and any torch.

On a GPU the demo's step (dim 64) is bound by host work, so the host's cost per step decides
its speed. The fake accelerator (``testing.fake_accelerator``) makes ``userstreams`` take
the path it takes on CUDA (streams and events say ``cuda:0``; with GPU semantics the passes
place the syncs a GPU graph gets) while tensors stay on the CPU. Contenders, in blocks taking
turns in one process, each compiling the model with its loss as the demo does:

* ``userstreams`` on the demo model, its streams and events on the fake accelerator;
* ``inductor`` on the same model without streams.

The ratio is the median over rounds of each round's userstreams/inductor steps/s; the host
microseconds per step beyond Inductor's are the median over rounds of the difference of the
two per-step times. The streams and events are made once, outside ``forward``: Dynamo builds
a ``torch.Stream(device="cuda")`` example natively, which a build without CUDA refuses.
"""

from __future__ import annotations

import time

import torch

from torch_userstreams.demo.model import (
    Batch,
    DemoModel,
    ForwardAndLoss,
    SideStreamBlock,
    build_model,
    make_batches,
)
from torch_userstreams.patch.install import session
from torch_userstreams.testing.capture import no_compile_caches
from torch_userstreams.testing.fake_accelerator import (
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)

from .results import Row, ratio_row
from .timing import abba, median

BENCH = "demo"
MIN_RATIO = 0.95  # userstreams steps/s over inductor's on the model without streams
MAX_COMPILE_RATIO = 1.5  # the first step's time, userstreams over inductor without streams
DIM, BATCH, BLOCKS, LR, SEED = 64, 64, 2, 0.01, 0
USERSTREAMS, INDUCTOR = "userstreams", "inductor, no streams"
# Inductor 2.12+ compiles the graph with its streams into one call per graph (the package's
# passes place its syncs; ``inductor.launch_code`` resolves the call's objects at its start
# and issues each sync as their method). A diagnostic for issue 38: what one compiled call
# per graph gives, beside the package's regions.
ONE_CALL = "native inductor with streams, installed"
# ``userstreams`` compiles one call per graph by default on torch 2.12+; its regions, asked
# for (``options={"userstreams.one_call": False}``), beside it.
USERSTREAMS_REGIONS = "userstreams, regions"


class FakeAcceleratorBlock(SideStreamBlock):
    """The demo's block with its side stream and events made once, on the fake accelerator."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim, torch.device("cpu"))
        self.made = (FakeAcceleratorStream(), FakeAcceleratorEvent(), FakeAcceleratorEvent())

    def objects(self) -> tuple[torch.Stream, torch.Stream, torch.Event, torch.Event]:
        side, ready, done = self.made
        return torch.accelerator.current_stream(), side, ready, done


def model(streams: bool) -> DemoModel:
    """The demo model (same weights either way); with ``streams``, on the fake accelerator."""
    built = build_model(DIM, BLOCKS, torch.device("cpu"), SEED, streams=False)
    if streams:
        torch.manual_seed(SEED)
        built.blocks = torch.nn.Sequential(*(FakeAcceleratorBlock(DIM) for _ in range(BLOCKS)))
        built.head = torch.nn.Linear(DIM, 1)
    return built


def trainer(
    backend: str, streams: bool, options: dict[str, object] | None = None
) -> tuple[DemoModel, object]:
    net = model(streams)
    loss_of = torch.compile(ForwardAndLoss(net), backend=backend, options=options)
    optimizer = torch.optim.SGD(net.parameters(), lr=LR)

    def step(batch: Batch) -> None:
        x, y = batch
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(x, y)
        loss.backward()
        optimizer.step()
        loss.item()

    return net, step


def steps_per_s(step: object, batches: list[Batch]) -> float:
    start = time.perf_counter()
    for batch in batches:
        step(batch)  # type: ignore[operator]
    return len(batches) / (time.perf_counter() - start)


def interleaved(rounds: int, block: int, *, one_call: bool = False) -> dict[str, list[float]]:
    """steps/s of blocks of ``block`` steps, the contenders taking turns (order reversed
    every round), on the fake accelerator with GPU semantics. ``one_call`` adds native
    Inductor on the model with streams, while installed (``ONE_CALL``), and ``userstreams``
    asked for regions (``USERSTREAMS_REGIONS``)."""
    batches = make_batches(block, BATCH, DIM, torch.device("cpu"), SEED)
    with session(), fake_accelerator(gpu_semantics=True), no_compile_caches():
        steps = {
            USERSTREAMS: trainer("userstreams", True)[1],
            INDUCTOR: trainer("inductor", False)[1],
        }
        if one_call:
            steps[ONE_CALL] = trainer("inductor", True)[1]
            regions = {"userstreams.one_call": False}
            steps[USERSTREAMS_REGIONS] = trainer("userstreams", True, regions)[1]
        for step in steps.values():  # compile and warm up
            steps_per_s(step, batches[:3])
        samples: dict[str, list[float]] = {name: [] for name in steps}
        names = list(steps)
        for r in range(rounds):
            for name in names if r % 2 == 0 else reversed(names):
                samples[name].append(steps_per_s(steps[name], batches))
    return samples


def rows(rounds: int, block: int) -> list[Row]:
    samples = interleaved(rounds, block)
    pairs = list(zip(samples[USERSTREAMS], samples[INDUCTOR], strict=True))
    ratio = median([ours / theirs for ours, theirs in pairs])
    beyond_us = median([(1 / ours - 1 / theirs) * 1e6 for ours, theirs in pairs])
    details = {"blocks_steps_per_s": samples, "rounds": rounds, "block": block}
    speed = Row(
        BENCH,
        "steps/s, fake accelerator: userstreams over inductor without streams",
        median(samples[INDUCTOR]),
        median(samples[USERSTREAMS]),
        "steps/s",
        ratio=ratio,
        target=f">= {MIN_RATIO:g}x",
        ok=ratio >= MIN_RATIO,
        details=details,
    )
    host = Row(
        BENCH,
        "host us per step beyond inductor's (fake accelerator; package column)",
        median([1e6 / theirs for _, theirs in pairs]),
        beyond_us,
        "us",
    )
    return [speed, host]


def one_call_rows(rounds: int, block: int) -> list[Row]:
    """One call per graph, with the model's streams (native Inductor installed, and
    ``userstreams`` by default), against Inductor on the model without streams, and
    ``userstreams``'s regions in the same run. No target (``rows`` has it): it says what
    one compiled call per graph gives over the regions. (On 2.11 the installed package
    places native Inductor's nodes on their streams too.)"""
    samples = interleaved(rounds, block, one_call=True)
    rows = []
    for name in (ONE_CALL, USERSTREAMS, USERSTREAMS_REGIONS):
        pairs = list(zip(samples[name], samples[INDUCTOR], strict=True))
        rows.append(
            Row(
                BENCH,
                f"steps/s, fake accelerator: {name} over inductor without streams",
                median(samples[INDUCTOR]),
                median(samples[name]),
                "steps/s",
                ratio=median([ours / theirs for ours, theirs in pairs]),
                details={"blocks_steps_per_s": samples, "rounds": rounds, "block": block},
            )
        )
    return rows


def python_calls_per_step(step: object, batches: list[Batch]) -> float:
    """Python function calls (and C functions called from Python) per step, as the profiler
    counts them: host work that the machine's speed does not blur."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.enable()
    for batch in batches:
        step(batch)  # type: ignore[operator]
    profile.disable()
    return pstats.Stats(profile).total_calls / len(batches)  # type: ignore[attr-defined, no-any-return]


def host_calls_rows(steps: int) -> list[Row]:
    """Python calls per step of ``userstreams`` on the model with streams, against
    ``inductor`` on the model without, on the fake accelerator: the host work the package's
    compiled step adds (its lookups, its syncs and stream blocks, which the fake
    accelerator simulates in Python where a GPU runs them in C++), counted, not timed."""
    batches = make_batches(steps, BATCH, DIM, torch.device("cpu"), SEED)
    calls: dict[str, float] = {}
    with session(), fake_accelerator(gpu_semantics=True), no_compile_caches():
        for name, backend, streams in (
            (USERSTREAMS, "userstreams", True),
            (INDUCTOR, "inductor", False),
        ):
            step = trainer(backend, streams)[1]
            steps_per_s(step, batches[:3])  # compile and warm up
            calls[name] = python_calls_per_step(step, batches)
    case = "python calls per step, fake accelerator: userstreams beside inductor without streams"
    return [
        Row(
            BENCH,
            case,
            calls[INDUCTOR],
            calls[USERSTREAMS],
            "calls",
            ratio=calls[USERSTREAMS] / calls[INDUCTOR],
            details={"steps": steps},
        )
    ]


def first_step_s(streams: bool) -> float:
    """Seconds for the first training step on the fake accelerator: trace, compile the
    forward and the backward (one call each on torch 2.12+, regions on 2.11), run."""
    torch._dynamo.reset()
    batch = make_batches(1, BATCH, DIM, torch.device("cpu"), SEED)[0]
    step = trainer("userstreams" if streams else "inductor", streams)[1]
    start = time.perf_counter()
    step(batch)  # type: ignore[operator]
    elapsed = time.perf_counter() - start
    torch._dynamo.reset()
    return elapsed


def compile_rows(repeats: int) -> list[Row]:
    """The first step's time, ``userstreams`` on the model with streams over Inductor on
    the model without, on the fake accelerator (the path a GPU takes)."""
    samples: dict[bool, list[float]] = {False: [], True: []}
    with session(), fake_accelerator(gpu_semantics=True), no_compile_caches():
        first_step_s(False)  # lazy imports and first-use costs, discarded
        first_step_s(True)
        for pair in abba(False, True, repeats):
            for streams in pair:
                samples[streams].append(first_step_s(streams))
    inductor, userstreams = median(samples[False]), median(samples[True])
    details = {"inductor_no_streams_s": samples[False], "userstreams_s": samples[True]}
    case = "compile (first step), fake accelerator: userstreams over inductor without streams"
    return [ratio_row(BENCH, case, inductor, userstreams, "s", MAX_COMPILE_RATIO, details)]
