"""Syncs a user writes in a custom ``autograd.Function``'s backward run in the backward.

Such a sync reaches AOTAutograd's joint graph without the backward's tag (it has no
tensor to carry it), and the package took untagged syncs for forward ones: the event was
recorded and waited during the forward call and never during ``backward()`` — on a GPU,
a silent race — and ``userstreams`` crashed at run time (``UnboundLocalError``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import torch_userstreams
from torch_userstreams.fx.meta import stream_of
from torch_userstreams.patch.points import minor_of
from torch_userstreams.simulator import SimEvent, SimStream
from torch_userstreams.testing.capture import capture, no_compile_caches
from torch_userstreams.testing.checker import CURRENT_STREAMS_META
from torch_userstreams.testing.fake_accelerator import (
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)

OBJECTS: dict[str, Any] = {}


class SyncInBackward(torch.autograd.Function):
    """``sin`` forward; its backward passes the gradient through and syncs."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.sin()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        OBJECTS["event"].record(OBJECTS["side"])
        OBJECTS["event"].wait(OBJECTS["main"])
        return grad


def loss(x: torch.Tensor) -> torch.Tensor:
    return SyncInBackward.apply(x * 2).sum()  # type: ignore[no-any-return]


@contextlib.contextmanager
def objects(where: str) -> Iterator[None]:
    torch_userstreams.install()
    with contextlib.ExitStack() as stack:
        stack.enter_context(no_compile_caches())
        if where == "fake accelerator":
            stack.enter_context(fake_accelerator())
            OBJECTS.update(
                side=FakeAcceleratorStream(),
                event=FakeAcceleratorEvent(),
                main=torch.accelerator.current_stream(),
            )
        else:
            OBJECTS.update(side=SimStream(device="cpu"), event=SimEvent(device="cpu"))
            OBJECTS["main"] = SimStream(device="cpu")
        try:
            yield
        finally:
            OBJECTS.clear()


def issued_syncs(backend: str, where: str) -> tuple[list[str], ...]:
    """What the event logs during ``backward()``: its record and its wait, the wait logged
    as ``waited_by`` where torch (2.11) issues it as ``stream.wait_event``. ``userstreams``
    compiles an all-CPU graph as one Inductor graph without its syncs (every CPU op runs in
    program order, so they are already satisfied): nothing."""
    if backend == "userstreams" and where == "cpu":
        return ([],)
    return (["record", "wait"], ["record", "waited_by"])


@pytest.mark.parametrize("where", ["cpu", "fake accelerator"])
@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_a_sync_in_a_custom_backward_runs_in_the_backward(backend: str, where: str) -> None:
    with objects(where):
        x = torch.randn(5, requires_grad=True)
        out = torch.compile(loss, backend=backend)(x)
        after_forward = [name for name, _ in OBJECTS["event"].log]
        out.backward()
        after_backward = [name for name, _ in OBJECTS["event"].log]
    assert after_forward == []
    assert after_backward in issued_syncs(backend, where)
    torch.testing.assert_close(x.grad, torch.full((5,), 2.0))


def returns_the_function_output(x: torch.Tensor) -> torch.Tensor:
    return SyncInBackward.apply(x * 2)  # type: ignore[no-any-return]


@pytest.mark.parametrize("where", ["cpu", "fake accelerator"])
@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_a_sync_that_opens_the_backward_runs_in_it(backend: str, where: str) -> None:
    """The compiled function returns the Function's output, so its backward is the first
    thing the compiled backward runs: its sync comes before any node that reads a tangent.
    The min-cut partitioner's reordering (``userstreams``) dropped such syncs."""
    with objects(where):
        x = torch.randn(5, requires_grad=True)
        out = torch.compile(returns_the_function_output, backend=backend)(x)
        after_forward = [name for name, _ in OBJECTS["event"].log]
        out.sum().backward()
        after_backward = [name for name, _ in OBJECTS["event"].log]
    assert after_forward == []
    assert after_backward in issued_syncs(backend, where)
    torch.testing.assert_close(x.grad, torch.full((5,), 2.0))


def test_min_cut_keeps_a_sync_that_opens_the_backward_before_the_gradient_work() -> None:
    """The partitioner ``userstreams`` uses, on its own: the backward graph keeps the sync,
    in front of the gradient work that followed it (``patch.backward_order``)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    graphs: list[torch.fx.GraphModule] = []

    def keep(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(
        fw_compiler=keep, bw_compiler=keep, partition_fn=min_cut_rematerialization_partition
    )
    with objects("cpu"):
        x = torch.randn(5, requires_grad=True)
        torch.compile(returns_the_function_output, backend=backend)(x).sum().backward()
    [_, backward] = graphs
    ops = [str(n.target) for n in backward.graph.nodes if n.op == "call_function"]
    # torch 2.11 leaves the wait a plain op; later releases wrap it in control_deps.
    wait = "streams.wait_event.default" if minor_of(torch.__version__) == "2.11" else "control_deps"
    assert ops == ["streams.record_event.default", wait, "aten.mul.Tensor"]


def side_then_main(x: torch.Tensor, w: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    with side:
        y = (x * w).sin()
    return (y * w).sum()


def test_compiled_autograd_over_a_stream_backward_is_refused_by_name() -> None:
    """Compiled autograd retraces the backward without the forward call's binding. The
    error said only "outside any compiled call"; it now names compiled autograd."""
    with objects("cpu"):
        x, w = torch.randn(5, requires_grad=True), torch.randn(5, requires_grad=True)
        loss_ = torch.compile(side_then_main, backend="userstreams")(x, w, OBJECTS["side"])
        from torch._dynamo import compiled_autograd

        with pytest.raises(Exception, match="Compiled autograd is on"):
            with compiled_autograd._enable(torch.compile(backend="aot_eager")):
                loss_.backward()


class SideStreamBackward(torch.autograd.Function):
    """``sin`` forward; its backward computes ``cos`` under ``with side:``, synced both ways
    as a GPU needs it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        side, main = OBJECTS["side"], OBJECTS["main"]
        side.wait_stream(main)  # x and grad were made on main
        with side:
            out = grad * x.cos()
        main.wait_stream(side)  # autograd reads the result on main
        return out


def side_stream_backward_loss(x: torch.Tensor) -> torch.Tensor:
    return SideStreamBackward.apply(x * 2).sum()  # type: ignore[no-any-return]


def cos_nodes(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.target is torch.ops.aten.cos.default]


@pytest.mark.parametrize("where", ["cpu", "fake accelerator"])
@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_a_stream_context_in_a_custom_backward_compiles_and_runs_on_its_stream(
    backend: str, where: str
) -> None:
    """Its nodes reached the joint graph untagged and were taken for forward ones: with
    ``userstreams_aot_eager`` on CPU the partitioner rejected the graph ("Node ... was
    invalid, but is output"). They are the backward's now (``passes.backward_phase``)."""
    with objects(where):
        x = torch.randn(5, requires_grad=True)
        captured = capture(side_stream_backward_loss, x, backend=backend)
        expected = torch.autograd.grad(side_stream_backward_loss(x), x)[0]
    torch.testing.assert_close(x.grad, expected)
    # Where the partitioner puts it is its choice (min-cut computes it in the forward and
    # saves it); it runs once, on the side stream.
    [(gm, cos)] = [(gm, cos) for _, gm in captured.graphs for cos in cos_nodes(gm)]
    assert stream_of(cos) is not None
    assert stream_of(cos) not in set(gm.meta[CURRENT_STREAMS_META].values())
