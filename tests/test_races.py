"""The run-time race detector, with GPU semantics on the fake accelerator.

On CPU no value can show a missing sync, and with CPU tensors every cross-stream access is
host-ordered, so the passes place no sync and the static checker has nothing to check.
``fake_accelerator(gpu_semantics=True)`` makes the package compile the graphs a GPU would
get, and ``detect_races()`` runs them as a GPU orders them. Controls: a racy program is
flagged, and so is every program once a sync pass is switched off. Then the generated
programs and training steps run through it, on both backends.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_generated_programs import PROFILE

from torch_userstreams.passes import backward_syncs, dealloc_syncs, write_backs
from torch_userstreams.testing.fake_accelerator import (
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)
from torch_userstreams.testing.hazards import HazardKind
from torch_userstreams.testing.programs import (
    InPlace,
    NewEvent,
    Op,
    Program,
    UserSync,
    With,
    leaves,
)
from torch_userstreams.testing.races import RaceReport, detect_races
from torch_userstreams.testing.strategies import programs

BACKENDS = ["userstreams_aot_eager", "userstreams"]
TORCH = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
DETECTOR_SHARE = 4  # the generated-program property runs a quarter of the profile's examples


@pytest.fixture
def gpu() -> Iterator[FakeAcceleratorStream]:
    """The fake accelerator with GPU semantics, the package installed, no compile cache."""
    from torch_userstreams.testing.capture import no_compile_caches

    with fake_accelerator(gpu_semantics=True) as ambient, no_compile_caches():
        yield ambient


W = torch.randn(8, 8, requires_grad=True)


def unjoined(x: torch.Tensor, side: torch.Stream, main: torch.Stream) -> torch.Tensor:
    """Races twice: the side stream reads ``x`` without waiting for main, which wrote it,
    and main reads ``y`` without waiting for the side stream."""
    with side:
        y = (x @ W).relu()
    return y.sum()


def joined(x: torch.Tensor, side: torch.Stream, main: torch.Stream) -> torch.Tensor:
    side.wait_stream(main)
    with side:
        y = (x @ W).relu()
    main.wait_stream(side)
    return y.sum()


def run_steps(
    fn: Callable[..., torch.Tensor], backend: str, main: torch.Stream, steps: int = 2
) -> RaceReport:
    """``steps`` forward and backward calls, each on a fresh side stream."""
    compiled = torch.compile(fn, backend=backend)
    with detect_races({"main": main}) as report:
        for _ in range(steps):
            compiled(torch.randn(4, 8), FakeAcceleratorStream(), main).backward()
    return report


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_racy_program_is_flagged_naming_ops_streams_and_fix(
    backend: str, gpu: FakeAcceleratorStream
) -> None:
    report = run_steps(unjoined, backend, gpu)
    kinds = {(f.kind, f.first_stream == id(gpu)) for f in report.findings}
    assert (HazardKind.RAW, True) in kinds  # the side stream reads what main wrote
    assert (HazardKind.RAW, False) in kinds  # main reads what the side stream wrote
    fork = next(f for f in report.findings if f.first_stream == id(gpu))
    assert fork.detail.startswith("mm") and "on stream #0 reads memory allocated by randn" in (
        fork.detail
    )
    assert fork.fix.startswith("record an event on main after randn (eager, test_races.py:")
    assert "graph unjoined" in fork.second and fork.fix.endswith(
        f"wait for it on stream #0 before {fork.second}"
    )
    assert not report and "race(s)" in str(report)


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_joined_program_is_race_free(backend: str, gpu: FakeAcceleratorStream) -> None:
    report = run_steps(joined, backend, gpu)
    assert report, str(report)
    assert report.kernels > 10 and report.syncs >= 8  # it watched both calls


def batch_norm_step(bn: torch.nn.Module) -> Callable[..., torch.Tensor]:
    def step(x: torch.Tensor, side: torch.Stream, main: torch.Stream) -> torch.Tensor:
        side.wait_stream(main)
        with side:
            y = bn(x @ W).relu()
        main.wait_stream(side)
        return y.sum()

    return step


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    ("backend", "grad"),
    [
        ("userstreams_aot_eager", True),
        ("userstreams_aot_eager", False),
        ("userstreams", True),
        ("userstreams", False),
    ],
)
def test_batch_norm_statistics_are_written_before_the_join(
    backend: str, grad: bool, gpu: FakeAcceleratorStream
) -> None:
    """Two micro-batches on fresh side streams, one backward: with the running statistics
    written after the user's join (``userstreams_aot_eager`` did), the second forward races
    the first on them."""
    bn = torch.nn.BatchNorm1d(8)
    compiled = torch.compile(batch_norm_step(bn), backend=backend)
    with detect_races({"main": gpu}) as report:
        micro_batches(compiled, gpu, grad)
    assert report, str(report)
    assert int(bn.num_batches_tracked) == 2


def micro_batches(compiled: Callable[..., torch.Tensor], main: torch.Stream, grad: bool) -> None:
    """Two forward calls on fresh side streams, then one backward of both (with ``grad``)."""
    with torch.set_grad_enabled(grad):
        loss = sum(compiled(torch.randn(4, 8), FakeAcceleratorStream(), main) for _ in range(2))
    if grad:
        loss.backward()  # type: ignore[union-attr]


def _without(module: Any) -> Any:
    return dataclasses.replace(module.PASS, run=lambda gm, compile_: [])


def freed_in_forward(x: torch.Tensor, side: torch.Stream, main: torch.Stream) -> torch.Tensor:
    """``h`` is made on the side stream, read on main, and dies in the forward."""
    side.wait_stream(main)
    with side:
        h = (x @ W).tanh()
    main.wait_stream(side)
    return (h * 2).sum()


# pass -> (its module, a program that needs it, with backward?, the backends it is theirs
# on). Inductor's own scheduling puts write-backs before the join (``userstreams`` never
# needed the pass there); the backend's reuse pass re-syncs what dealloc_syncs left out,
# so it is switched off with it.
CONTROLS = {
    "backward_syncs": (backward_syncs, joined, True, BACKENDS),
    "dealloc_syncs": (dealloc_syncs, freed_in_forward, False, BACKENDS),
    "write_backs": (
        write_backs,
        batch_norm_step(torch.nn.BatchNorm1d(8)),
        True,
        ["userstreams_aot_eager"],
    ),
}


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    ("name", "backend"),
    [(name, backend) for name, control in CONTROLS.items() for backend in control[3]],
)
def test_switching_off_a_sync_pass_makes_its_program_race(
    name: str, backend: str, gpu: FakeAcceleratorStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch_userstreams.inductor import reuse_syncs

    module, fn, grad, _ = CONTROLS[name]
    compiled = torch.compile(fn, backend=backend)

    def two_steps() -> RaceReport:
        with detect_races({"main": gpu}) as report:
            micro_batches(compiled, gpu, grad)
        return report

    assert two_steps(), "the program races with every pass on"
    torch._dynamo.reset()
    monkeypatch.setattr(module, "PASS", _without(module))
    if module is dealloc_syncs:
        monkeypatch.setattr(reuse_syncs, "resync_reuse", lambda *args, **kwargs: [])
    report = two_steps()
    assert not report, f"switching off {name} went unseen"


MADE = re.compile(r"^(\s*)(\w+) = (?:Event\(device=DEVICE\)|torch\.Stream\(device=DEVICE\))$")


def fake_accelerator_program(program: Program) -> tuple[Callable[..., Any], list[Any]]:
    """The program as on a GPU (framed by a fork from and a join to the current stream),
    with the streams and events it makes passed in instead, as the fake accelerator's:
    Dynamo cannot build a ``torch.Stream(device="cuda")`` example without CUDA, and one
    of the fake accelerator's is made eagerly, behind a graph break. An event made twice
    is the same object twice: a wait on its first recording then orders more, never less."""
    lines, made = [], {}
    for line in program.source(eager=False, device="cuda", frame=True).splitlines():
        found = MADE.match(line)
        if found is None:
            lines.append(line)
            continue
        lines.append(f"{found.group(1)}pass")
        made.setdefault(found.group(2), "Stream" in line)
    objects = [
        FakeAcceleratorStream() if stream else FakeAcceleratorEvent() for stream in made.values()
    ]
    lines[0] = lines[0].replace("):", "".join(f", {name}" for name in made) + "):")
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile("\n".join(lines) + "\n", "<program>", "exec"), namespace)
    return namespace["program"], objects


def run_generated(
    program: Program, backend: str, options: dict[str, Any] | None = None
) -> RaceReport:
    """One call with backward of a generated program, as on a GPU."""
    fn, objects = fake_accelerator_program(program)
    compiled = torch.compile(fn, backend=backend, options=options)
    x, w = leaves()
    streams = [FakeAcceleratorStream() for _ in program.input_streams]
    with detect_races() as report:
        out = compiled(x, w, *streams, *objects)
        tensors = [t for t in out if t.requires_grad]
        if tensors:
            sum(t.sum() for t in tensors).backward()  # type: ignore[union-attr]
    return report


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    ("backend", "share", "options"),
    [
        ("userstreams_aot_eager", DETECTOR_SHARE, None),
        pytest.param("userstreams", 10, {"userstreams.one_call": False}, id="userstreams-regions"),
        pytest.param(
            "userstreams",
            10,
            None,  # the default
            id="userstreams-one-call",
        ),
    ],
)
@given(data=st.data())
@settings(PROFILE)
def test_generated_programs_do_not_race_on_a_gpu(
    backend: str, share: int, options: dict[str, Any] | None, data: st.DataObject
) -> None:
    """Every generated program, framed as on a GPU, runs race-free forward and backward
    (a quarter of the profile's examples through ``userstreams_aot_eager``, a tenth
    through ``userstreams``'s regions and a tenth through its one call per graph, its
    default on torch 2.12+, whose compiles are slower)."""
    if data.draw(st.integers(0, share - 1), label="sampled out") != 0:
        return
    program = data.draw(programs(graph_breaks=False), label="program")
    torch._dynamo.reset()
    with fake_accelerator(gpu_semantics=True):
        report = run_generated(program, backend, options)
    assert report, f"{report}\n{program}"


# Found by the property above (ci profile, ``userstreams``): the backward of ``v9 = v8.cos()``
# runs on ``s1`` (it shares its sequence number with ``v7``'s) and read ``v8``, made on the
# current stream after ``s1`` last waited for it, with no wait at the backward's entry.
SAVED_ON_THE_CURRENT_STREAM = Program(
    input_streams=(),
    local_streams=("s0", "s1"),
    body=(
        NewEvent(name="e1"),
        UserSync(form="record", args=("e1", "s0")),
        UserSync(form="wait", args=("e1", "s1")),
        NewEvent(name="e2"),
        UserSync(form="record", args=("e2", "s0")),
        UserSync(form="wait", args=("e2", "s1")),
        With(
            stream="s0",
            body=(
                Op(dst="v3", kind="cos", args=("x",)),
                NewEvent(name="e4"),
                UserSync(form="record", args=("e4", "s0")),
                UserSync(form="wait", args=("e4", "s1")),
                With(
                    stream="s1",
                    body=(
                        NewEvent(name="e5"),
                        UserSync(form="record", args=("e5", "s0")),
                        UserSync(form="wait", args=("e5", "s1")),
                        InPlace(kind="add_", args=("v3", "x")),
                        InPlace(kind="mul_", args=("v3",)),
                    ),
                ),
            ),
        ),
        With(
            stream="s0",
            body=(
                NewEvent(name="e6"),
                UserSync(form="record", args=("e6", "s0")),
                UserSync(form="wait", args=("e6", "s1")),
            ),
        ),
        With(stream="s1", body=(Op(dst="v7", kind="cos", args=("w",)),)),
        Op(dst="v8", kind="cos", args=("x",)),
        Op(dst="v9", kind="cos", args=("v8",)),
        With(
            stream="s1",
            body=(
                NewEvent(name="e10"),
                UserSync(form="record", args=("e10", "s1")),
                UserSync(form="wait", args=("e10", "s0")),
                With(
                    stream="s0",
                    body=(
                        NewEvent(name="e11"),
                        UserSync(form="record", args=("e11", "s0")),
                        UserSync(form="synchronize_event", args=("e11",)),
                        Op(dst="v12", kind="sub", args=("x", "x")),
                    ),
                ),
            ),
        ),
        With(stream="s0", body=(Op(dst="v13", kind="scale", args=("w",)),)),
    ),
    outputs=("v7", "v9", "v12", "v13"),
)


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_forward_value_read_on_a_side_stream_in_the_backward_is_waited_for(
    backend: str,
) -> None:
    torch._dynamo.reset()
    with fake_accelerator(gpu_semantics=True):
        report = run_generated(SAVED_ON_THE_CURRENT_STREAM, backend)
    assert report, str(report)


W0 = torch.randn(8, 8, requires_grad=True)


def transposed_copy_updated_on_the_side(
    x: torch.Tensor, side: torch.Stream, main: torch.Stream
) -> torch.Tensor:
    h = (x @ W0).tanh()
    side.wait_stream(main)
    with side:
        t = (h.t() * 1.5).t()
        t.mul_(2)
    main.wait_stream(side)
    return (t * h).sum()


@pytest.mark.usefixtures("installed")
def test_a_side_stream_update_of_a_transposed_copy_compiles_by_default(
    gpu: FakeAcceleratorStream,
) -> None:
    """Inductor's passes move a read of ``t``'s buffer to another stream in the backward;
    only a backward compiled with its forward can get the event that orders the buffer's
    reuse. It was refused at the first backward unless the user set
    ``force_non_lazy_backward_lowering``."""
    x = torch.randn(4, 8)
    compiled = torch.compile(transposed_copy_updated_on_the_side, backend="userstreams")
    with detect_races({"main": gpu}) as report:
        compiled(x, FakeAcceleratorStream(), gpu).backward()
    assert report, str(report)
    assert W0.grad is not None
    compiled_grad, W0.grad = W0.grad, None
    transposed_copy_updated_on_the_side(x, FakeAcceleratorStream(), gpu).backward()
    torch.testing.assert_close(compiled_grad, W0.grad)


class TwoStreamBlock(torch.nn.Module):
    """``x + relu(main(x)) + tanh(norm(side(x)))``, the side branch on its own stream."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.main = torch.nn.Linear(dim, dim)
        self.side = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.BatchNorm1d(dim)

    def forward(self, x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
        main = torch.accelerator.current_stream()
        side.wait_stream(main)
        with side:
            branch = torch.tanh(self.norm(self.side(x)))
        main.wait_stream(side)
        return x + torch.relu(self.main(x)) + branch


class TrainingStep(torch.nn.Module):
    def __init__(self, dim: int = 8) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(TwoStreamBlock(dim) for _ in range(2))
        self.head = torch.nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor, sides: list[torch.Stream]) -> torch.Tensor:
        for block, side in zip(self.blocks, sides, strict=True):
            x = block(x, side)
        return torch.nn.functional.mse_loss(self.head(x), y)


def train(step: Callable[..., torch.Tensor], model: torch.nn.Module) -> list[float]:
    """Three optimizer steps of two micro-batches each, every call on fresh side streams."""
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    losses = []
    for _ in range(3):
        for _ in range(2):
            x, y = torch.randn(4, 8, generator=generator), torch.randn(4, 1, generator=generator)
            loss = step(x, y, [FakeAcceleratorStream(), FakeAcceleratorStream()])
            loss.backward()
            losses.append(loss.item())
        optimizer.step()
        optimizer.zero_grad()
    return losses


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_training_loop_does_not_race_and_matches_eager(
    backend: str, gpu: FakeAcceleratorStream
) -> None:
    """Forward, backward, gradient accumulation over micro-batches, BatchNorm statistics and
    the optimizer, all watched: the backward's entry (gradients made on the current stream)
    and exit (the optimizer reads them there) included."""
    torch.manual_seed(0)
    model = TrainingStep()
    reference = TrainingStep()
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend=backend)
    with detect_races({"main": gpu}) as report:
        losses = train(compiled, model)
    assert report, str(report)
    assert report.kernels > 100
    torch.testing.assert_close(losses, train(reference, reference))
    for ours, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(ours, theirs)


def offloaded(x: torch.Tensor, side: torch.Stream, main: torch.Stream) -> torch.Tensor:
    h = torch.tanh(x @ W0)
    side.wait_stream(main)
    with side:
        a = torch.sin(h @ W) * h
    main.wait_stream(side)
    return torch.relu(a).sum()


def traced(fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn)(torch.randn(4, 8))


HOOKS = {
    "clone, traced (inlined by AOTAutograd)": lambda: (
        traced(torch.clone),
        traced(torch.clone),
    ),
    "clone, plain functions": lambda: (torch.clone, torch.clone),
    "bf16 pack, fp32 unpack, traced": lambda: (
        traced(lambda t: t.to(torch.bfloat16)),
        traced(lambda t: t.to(torch.float32)),
    ),
}


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hooks", HOOKS)
def test_saved_tensors_hooks_around_streams_are_refused_naming_them(
    hooks: str, backend: str, gpu: FakeAcceleratorStream
) -> None:
    """AOTAutograd applies them after the package's passes: the pack hook read side-stream
    tensors unsynced (3 hazards with the traced clone; the bf16 one failed inside Inductor
    with ``expected predicate to be bool``). The way out the error gives, calling the
    function outside the hooks' block, is race-free."""
    pack, unpack = HOOKS[hooks]()
    compiled = torch.compile(offloaded, backend=backend)
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), pytest.raises(Exception) as exc:
        compiled(torch.randn(4, 8), FakeAcceleratorStream(), gpu)
    message = str(exc.value)
    assert "graph offloaded [0/0] uses accelerator streams and is compiled inside" in message
    assert "torch.autograd.graph.saved_tensors_hooks(pack=" in message
    assert "Call the compiled function outside the saved_tensors_hooks block" in message
    torch._dynamo.reset()
    with detect_races({"main": gpu}) as report:
        compiled(torch.randn(4, 8), FakeAcceleratorStream(), gpu).backward()
    assert report, str(report)


@pytest.mark.usefixtures("installed")
def test_saved_tensors_hooks_without_grad_compile(gpu: FakeAcceleratorStream) -> None:
    """Without grad nothing is saved: the hooks never run, nothing is refused."""
    compiled = torch.compile(offloaded, backend="userstreams")
    with torch.autograd.graph.saved_tensors_hooks(torch.clone, torch.clone), torch.no_grad():
        with detect_races({"main": gpu}) as report:
            compiled(torch.randn(4, 8), FakeAcceleratorStream(), gpu)
    assert report, str(report)


@pytest.mark.usefixtures("installed")
def test_saved_tensors_hooks_around_cpu_streams_compile() -> None:
    """On CPU streams every op runs in program order: nothing can race, nothing is refused."""
    from torch_userstreams.simulator import SimStream

    side, main = SimStream(device="cpu"), SimStream(device="cpu")
    compiled = torch.compile(offloaded, backend="userstreams_aot_eager")
    with torch.autograd.graph.saved_tensors_hooks(torch.clone, torch.clone):
        out = compiled(torch.randn(4, 8), side, main)
    out.backward()
    assert W0.grad is not None


@pytest.mark.usefixtures("installed")
@pytest.mark.skipif(
    TORCH < (2, 12),
    reason="torch 2.11 gives this graph no current-stream entry, so the backend's re-sync "
    "cannot tell that the unannotated read runs on the stream passed in as main (it only "
    "backs up dealloc_syncs, which covers the read)",
)
def test_the_backend_re_syncs_what_the_dealloc_pass_left_out(
    gpu: FakeAcceleratorStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``dealloc_syncs`` switched off, ``userstreams``'s reuse pass syncs ``h``'s
    memory itself, on the current stream the graph did not load before: that call failed
    with "user object 0 ... was not loaded by the prologue"."""
    monkeypatch.setattr(dealloc_syncs, "PASS", _without(dealloc_syncs))
    compiled = torch.compile(freed_in_forward, backend="userstreams")
    with detect_races({"main": gpu}) as report:
        micro_batches(compiled, gpu, grad=False)
    assert report, str(report)


W2 = torch.randn(8, 8, requires_grad=True)


def prefetch(x: torch.Tensor, sides: list[torch.Stream], main: torch.Stream) -> torch.Tensor:
    """The next layer's weight is prepared on a side stream while main computes."""
    copy = sides[0]
    copy.wait_stream(main)
    with copy:
        ready = (W2 * 0.5).contiguous()
    h = torch.relu(x @ W0)
    main.wait_stream(copy)
    return (h @ ready).sum()


def fan_out(x: torch.Tensor, sides: list[torch.Stream], main: torch.Stream) -> torch.Tensor:
    """Mixture-of-experts style: each expert on its own stream, summed on main."""
    outs = []
    for side, weight in zip(sides, (W0, W2, W), strict=True):
        side.wait_stream(main)
        with side:
            outs.append(torch.tanh(x @ weight))
    for side in sides:
        main.wait_stream(side)
    return sum(o.sum() for o in outs)  # type: ignore[return-value]


EMA = torch.zeros(8)


def ema_on_the_side(x: torch.Tensor, sides: list[torch.Stream], main: torch.Stream) -> torch.Tensor:
    """A running average of activations updated in place on a side stream."""
    h = torch.relu(x @ W0)
    side = sides[0]
    side.wait_stream(main)
    with side:
        EMA.mul_(0.9).add_(h.detach().mean(0) * 0.1)
    main.wait_stream(side)
    return (h * 2).sum()


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", [prefetch, fan_out, ema_on_the_side], ids=lambda f: f.__name__)
def test_training_patterns_do_not_race_and_match_eager(
    fn: Callable[..., torch.Tensor], backend: str, gpu: FakeAcceleratorStream
) -> None:
    """Three calls with backward each, fresh side streams per call; gradients and the
    in-place state equal eager's."""

    def run(step: Callable[..., torch.Tensor]) -> list[torch.Tensor]:
        torch.manual_seed(0)
        EMA.zero_()
        for weight in (W0, W2, W):
            weight.grad = None
        for _ in range(3):
            sides = [FakeAcceleratorStream() for _ in range(3)]
            step(torch.randn(4, 8), sides, gpu).backward()
        return [EMA.clone(), *(w.grad.clone() for w in (W0, W2, W) if w.grad is not None)]

    compiled = torch.compile(fn, backend=backend)
    with detect_races({"main": gpu}) as report:
        ours = run(compiled)
    assert report, str(report)
    torch.testing.assert_close(ours, run(fn))
