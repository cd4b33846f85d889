"""On a CUDA GPU: stream training compiles, matches eager, and each call resolves its own objects.

Every test here is marked ``cuda``: without a GPU it is skipped with that reason
(``conftest.py``); ``tools/gpu_check.sh`` runs this module on a GPU machine. The same
behaviours are tested on CPU with the simulator elsewhere; here the streams and events are
real, and so are the races a wrong object would cause.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from torch_userstreams.compile.table import Phase
from torch_userstreams.demo.model import build_model, make_batches
from torch_userstreams.run import backward, plan
from torch_userstreams.run import lookup as lookup_module
from torch_userstreams.run.binding import Binding, graph_of, objects_of
from torch_userstreams.testing.objects import live_user_objects

pytestmark = [pytest.mark.cuda, pytest.mark.usefixtures("installed")]

DEVICE = torch.device("cuda")
BACKENDS = ("inductor", "userstreams", "userstreams_aot_eager")
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


def side_stream_step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Fork to a side stream, compute there, join back with an event; a scalar loss."""
    main = torch.accelerator.current_stream(x.device)
    side = torch.Stream(device=x.device)
    forked, joined = torch.Event(device=x.device), torch.Event(device=x.device)
    forked.record(main)
    forked.wait(side)
    with side:
        branch = (x * w).sin()
    joined.record(side)
    joined.wait(main)
    return (branch * w + x.cos()).sum()


def leaves(seed: int, device: torch.device = DEVICE) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, generator=gen).to(device).requires_grad_()
    w = torch.randn(1024, generator=gen).to(device).requires_grad_()
    return x, w


def eager_grads(fn: Callable[..., torch.Tensor], *args: Any) -> list[torch.Tensor]:
    tensors = [a.detach().clone().requires_grad_() for a in args[:2]]
    fn(*tensors, *args[2:]).backward()
    return [t.grad for t in tensors]  # type: ignore[misc]


@pytest.fixture
def backward_bindings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Binding]]:
    """The binding each backward resolved its objects against, in order: a backward
    program binds its autograd node's (``plan.bound_to_running_node``), a lookup outside
    one asks ``backward_binding``."""
    seen: list[Binding] = []

    def spy(real: Callable[..., Binding | None]) -> Callable[..., Binding | None]:
        def spied(**where: bool) -> Binding | None:
            binding = real(**where)
            if binding is not None:
                seen.append(binding)
            return binding

        return spied

    monkeypatch.setattr(plan, "backward_binding", spy(backward.backward_binding))
    monkeypatch.setattr(lookup_module, "backward_binding", spy(backward.backward_binding))
    yield seen


def backward_objects(binding: Binding) -> list[int]:
    """ids of the objects a call made for its backward (the passes' events)."""
    entries = graph_of(binding).table.entries
    return [id(objects_of(binding)[e.index]) for e in entries if e.phase is Phase.BACKWARD]


@pytest.mark.parametrize("backend", BACKENDS)
def test_training_matches_eager(backend: str) -> None:
    """At dim 256 a learning rate of 0.05 diverges (the loss passes 500 by step 5), and
    Inductor's float rounding, amplified, failed the comparison on an H200 with plain
    Inductor too (222 of 65,536 weights off): 0.01 trains stably, and the losses stay
    small so the comparison means something."""
    steps, dim = 5, 256
    batches = make_batches(steps, 64, dim, DEVICE, seed=0)
    eager = build_model(dim, 2, DEVICE, seed=0)
    model = build_model(dim, 2, DEVICE, seed=0)
    compiled = torch.compile(model, backend=backend)
    for trained, forward in ((eager, eager), (model, compiled)):
        optimizer = torch.optim.SGD(trained.parameters(), lr=0.01)
        for x, y in batches:
            optimizer.zero_grad(set_to_none=True)
            loss = F.mse_loss(forward(x), y)
            loss.backward()
            optimizer.step()
            assert loss.item() < 10, f"training diverged: loss {loss.item()}"
    for got, want in zip(model.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got, want, **TOLERANCE)


@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_fwd1_fwd2_bwd2_bwd1_resolve_their_own_events(
    backend: str, backward_bindings: list[Binding]
) -> None:
    from helpers import last_binding

    compiled = torch.compile(side_stream_step, backend=backend)
    x, w = leaves(0)
    out1 = compiled(x, w)
    bind1 = last_binding()
    out2 = compiled(x, w)
    bind2 = last_binding()
    own1, own2 = backward_objects(bind1), backward_objects(bind2)
    assert own1 and own2 and not set(own1) & set(own2), "fresh events per call"
    out2.backward()
    after_bwd2 = len(backward_bindings)
    out1.backward()
    assert after_bwd2 > 0 and len(backward_bindings) > after_bwd2
    assert all(backward_objects(b) == own2 for b in backward_bindings[:after_bwd2])
    assert all(backward_objects(b) == own1 for b in backward_bindings[after_bwd2:])
    torch.cuda.synchronize()
    want = eager_grads(side_stream_step, x, w)
    torch.testing.assert_close(x.grad, 2 * want[0], **TOLERANCE)
    torch.testing.assert_close(w.grad, 2 * want[1], **TOLERANCE)


@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_backward_on_another_thread(backend: str, backward_bindings: list[Binding]) -> None:
    from helpers import last_binding

    compiled = torch.compile(side_stream_step, backend=backend)
    x, w = leaves(1)
    out = compiled(x, w)
    own = backward_objects(last_binding())
    errors: list[BaseException] = []

    def run_backward() -> None:
        try:
            out.backward()
            torch.cuda.synchronize()
        except BaseException as exc:  # reported below, with the thread's traceback
            errors.append(exc)

    thread = threading.Thread(target=run_backward)
    thread.start()
    thread.join()
    assert errors == []
    assert backward_bindings and all(backward_objects(b) == own for b in backward_bindings)
    for got, want in zip((x.grad, w.grad), eager_grads(side_stream_step, x, w), strict=True):
        torch.testing.assert_close(got, want, **TOLERANCE)


def two_branches(x: torch.Tensor, y: torch.Tensor, s0: torch.Stream, s2: torch.Stream) -> Any:
    with s0:
        y0 = 2 * x + y
    with s2:
        z = 2 * x + y
    return (y0 * z).sum()


@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_cpu_tensors_in_cuda_streams(backend: str) -> None:
    """``torch.Stream()`` is a CUDA stream here; eager computes CPU tensors inside it."""
    x, y = leaves(2, torch.device("cpu"))
    s0, s2 = torch.Stream(), torch.Stream()
    assert s0.device.type == "cuda"
    out = torch.compile(two_branches, backend=backend)(x, y, s0, s2)
    out.backward()
    for got, want in zip((x.grad, y.grad), eager_grads(two_branches, x, y, s0, s2), strict=True):
        torch.testing.assert_close(got, want)


def test_no_live_objects_accumulate_over_1000_steps() -> None:
    compiled = torch.compile(side_stream_step, backend="userstreams")
    x, w = leaves(3)
    for _ in range(3):  # compile, and let every lazily made object exist
        compiled(x, w).backward()
    before = live_user_objects()
    for _ in range(1000):
        compiled(x, w).backward()
    torch.cuda.synchronize()
    assert live_user_objects() - before == 0


def test_one_call_launches_each_kernel_on_its_stream() -> None:
    """The one call on a GPU: a side stream's kernel is launched inside that stream's block,
    which is inside the device guard (on 2.11 the package writes the blocks, and a kernel
    launches on the raw stream fetched where it is called: ``inductor.placed_streams``), and
    forward and backward values are eager's."""
    import re

    from torch._inductor.utils import run_and_get_code

    x, w = leaves(5)
    compiled = torch.compile(side_stream_step, backend="userstreams")
    out, code = run_and_get_code(lambda: compiled(x, w))
    out.backward()
    torch.testing.assert_close([x.grad, w.grad], eager_grads(side_stream_step, *leaves(5)))
    forward = code[0][code[0].index("def call(") :]
    guard = re.search(r"\n( +)with torch\.cuda\._DeviceGuard\(\d+\):\n", forward)
    assert guard, forward
    block = re.search(r"\n( +)with (stream[1-9]\d*|user_object\d+):\n", forward[guard.end() :])
    assert block and len(block.group(1)) > len(guard.group(1)), forward
    inside = forward[guard.end() + block.end() :].split("\n")
    body = [line for line in inside if line.startswith(block.group(1) + "    ")]
    assert any("stream=" in line or "get_raw_stream" in line for line in body), forward


def main_passed_step(
    x: torch.Tensor,
    w: torch.Tensor,
    main: torch.Stream,
    side: torch.Stream,
    forked: Any,
    joined: Any,
) -> torch.Tensor:
    """``side_stream_step`` with its streams and events passed in, ``main`` among them, and
    its last computation inside ``with main:``: that block is what gives its backward pairs
    between the current stream and ``main`` (without it there are none)."""
    forked.record(main)
    forked.wait(side)
    with side:
        branch = (x * w).sin()
    joined.record(side)
    joined.wait(main)
    with main:
        return (branch * w + x.cos()).sum()


def test_a_backward_skips_its_pairs_between_the_current_stream_and_a_passed_main() -> None:
    """The current stream passed in as ``main``: on CUDA each ``current_stream()`` is a new
    object for the one stream, so the backward's guarded record/wait pairs between the
    current stream and ``main`` compare the streams, not the objects: they are equal, and
    the pairs are skipped, with eager's gradients."""
    import re

    from helpers import LAST_BINDING
    from torch._inductor.utils import run_and_get_code

    def objects() -> tuple[Any, ...]:
        return (
            torch.accelerator.current_stream(DEVICE),
            torch.Stream(device=DEVICE),
            torch.Event(device=DEVICE),
            torch.Event(device=DEVICE),
        )

    x, w = leaves(6)
    compiled = torch.compile(main_passed_step, backend="userstreams")
    _, code = run_and_get_code(lambda: compiled(x, w, *objects()).backward())
    backward_code = code[-1][code[-1].index("def call(") :]
    guarded = re.findall(
        r"if user_object(\d+) != user_object(\d+): user_object\d+\.record\(", backward_code
    )
    binding = LAST_BINDING[0]
    same = [(a, b) for a, b in guarded if binding[1 + int(a)] == binding[1 + int(b)]]
    assert same, backward_code
    assert all(binding[1 + int(a)] is not binding[1 + int(b)] for a, b in same)
    theirs = eager_grads(main_passed_step, *leaves(6), *objects())
    torch.testing.assert_close([x.grad, w.grad], theirs, **TOLERANCE)
