"""The compiled backward may reuse the memory of saved tensors only where that is true at run
time (``backends/donations.py``).

A sync's passthrough runs as its operand, so a passthrough of an input, or two passthroughs
of one value, are one tensor. Before the fix, the backward of ``userstreams`` reused such
"donated" saved tensors in place: wrong gradients on CPU (``event_after_side_work``), and the
caller's leaf tensors overwritten on an accelerator (``wait_on_current``). Both found by a
hostile test pass.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch._functorch._aot_autograd.streams as aot_streams
from helpers import REGIONS

import torch_userstreams
from torch_userstreams.backends import donations
from torch_userstreams.simulator import SimEvent, SimStream
from torch_userstreams.testing.capture import no_compile_caches
from torch_userstreams.testing.fake_accelerator import (
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)

BACKENDS = ("userstreams", "userstreams_aot_eager")


def event_after_side_work(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, side: torch.Stream, ev: torch.Event
) -> torch.Tensor:
    with side:
        h = torch.relu(x @ a)
    ev.record(side)
    ev.wait(side)
    return ((x @ b) * h).sum()


def wait_on_current(
    x: torch.Tensor, w: torch.Tensor, side: torch.Stream, ev: torch.Event
) -> torch.Tensor:
    with side:
        h = (x * w).sin()
    ev.record(side)
    ev.wait(torch.accelerator.current_stream())
    return (h * w + x).sum()


def leaves(count: int, shape: tuple[int, ...]) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=gen, requires_grad=True) for _ in range(count)]


def grads_and_leaves(
    fn: Callable[..., torch.Tensor], tensors: list[torch.Tensor], *objects: Any
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(gradients, the leaves' values after backward) of ``fn`` on copies of ``tensors``."""
    copies = [t.detach().clone().requires_grad_() for t in tensors]
    fn(*copies, *objects).backward()
    return [c.grad for c in copies], [c.detach() for c in copies]  # type: ignore[misc]


@pytest.fixture
def fresh_compiles() -> Iterator[None]:
    """Inductor's caches off, so every compile runs the backend (a hit would skip it)."""
    torch_userstreams.install()
    with no_compile_caches():
        yield


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize("backend", BACKENDS)
def test_cpu_backward_keeps_saved_passthroughs_apart(backend: str) -> None:
    tensors = leaves(3, (4, 4))
    expected, _ = grads_and_leaves(
        event_after_side_work, tensors, SimStream(device="cpu"), SimEvent(device="cpu")
    )
    compiled = torch.compile(event_after_side_work, backend=backend)
    got, _ = grads_and_leaves(compiled, tensors, SimStream(device="cpu"), SimEvent(device="cpu"))
    torch.testing.assert_close(got, expected)


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize("backend", BACKENDS)
def test_accelerator_backward_leaves_the_callers_leaves_alone(backend: str) -> None:
    tensors = leaves(2, (8,))
    with fake_accelerator():
        expected, _ = grads_and_leaves(
            wait_on_current, tensors, FakeAcceleratorStream(), FakeAcceleratorEvent()
        )
        compiled = torch.compile(wait_on_current, backend=backend)
        got, after = grads_and_leaves(
            compiled, tensors, FakeAcceleratorStream(), FakeAcceleratorEvent()
        )
    torch.testing.assert_close(after, [t.detach() for t in tensors])
    torch.testing.assert_close(got, expected)


@pytest.mark.skipif(
    not hasattr(aot_streams, "_wrap_sync_node"),
    reason="torch 2.11 does not wrap syncs in control_deps: no passthroughs, so the "
    "unamended donations this test caches first are right there",
)
def test_a_backward_cached_with_other_donations_is_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The FX graph cache key leaves donations out: without the package's tag, the second
    compile below loaded the first one's backward, which donates every saved tensor."""
    import torch._inductor.config as inductor_config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch_userstreams.install()
    tensors = leaves(3, (4, 4))
    expected, _ = grads_and_leaves(
        event_after_side_work, tensors, SimStream(device="cpu"), SimEvent(device="cpu")
    )

    def run() -> list[torch.Tensor]:
        torch._dynamo.reset()
        # As regions: on CPU, one graph without streams or syncs, the graph whose unamended
        # donations gave wrong gradients.
        compiled = torch.compile(event_after_side_work, backend="userstreams", options=REGIONS)
        return grads_and_leaves(compiled, tensors, SimStream(device="cpu"), SimEvent(device="cpu"))[
            0
        ]

    with inductor_config.patch(fx_graph_cache=True):
        with monkeypatch.context() as undo:
            # What AOTAutograd decided, unamended: the backward that got gradients wrong.
            undo.setattr(donations, "drop_aliased_donations", lambda gm: None)
            wrong = run()
        assert not all(torch.allclose(w, e) for w, e in zip(wrong, expected, strict=True))
        torch.testing.assert_close(run(), expected)


def update_a_slice_on_the_side(
    a: torch.Tensor, w: torch.Tensor, side: torch.Stream, main: torch.Stream
) -> torch.Tensor:
    with side:
        a[:2].add_(10)
    main.wait_stream(side)
    return (w * a[1:]).sum() * 1.5


@pytest.mark.usefixtures("fresh_compiles")
@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu", "fake accelerator"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_saved_view_of_an_updated_input_is_not_reused_by_the_backward(
    backend: str, accelerator: bool
) -> None:
    """Inductor computes the sliced update in ``a``'s memory, so the saved ``a[1:]`` (a view
    of a passthrough of the new value) is ``a`` itself at run time. Donated, it took
    ``w``'s gradient: ``a`` became [10, 16.5, 3, 4.5] after the backward (helper-34)."""
    context = fake_accelerator() if accelerator else contextlib.nullcontext()
    with context:
        make = FakeAcceleratorStream if accelerator else functools.partial(SimStream, "cpu")
        compiled = torch.compile(update_a_slice_on_the_side, backend=backend)
        a, w = torch.arange(4.0), torch.arange(3.0, requires_grad=True)
        compiled(a, w, make(), make()).backward()
    assert a.tolist() == [10.0, 11.0, 2.0, 3.0]
    assert w.grad is not None and w.grad.tolist() == [16.5, 3.0, 4.5]
