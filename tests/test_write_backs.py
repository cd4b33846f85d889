"""An input updated on a side stream is written back before the join that follows the update.

AOTAutograd writes such an update back with a ``copy_`` at the end of the graph, on the side
stream: after the function's own ``main.wait_stream(side)``, which then did not cover the
write (on a GPU the caller could read the input while the side stream still wrote it). Each
graph here must issue the write-back before the join, and compute what eager computes.
"""

from __future__ import annotations

import pytest
import torch
import torch.fx

from torch_userstreams.fx.meta import records
from torch_userstreams.simulator import SimStream
from torch_userstreams.testing import capture
from torch_userstreams.testing.mutations import syncs

pytestmark = pytest.mark.usefixtures("installed")
BACKENDS = ("userstreams_aot_eager", "userstreams")


def ema_on_a_side_stream(
    x: torch.Tensor, w: torch.Tensor, ema: torch.Tensor, side: torch.Stream, main: torch.Stream
) -> torch.Tensor:
    y = x * w
    with side:
        ema.mul_(0.9)
        ema.add_(y.detach() * 0.1)
    main.wait_stream(side)
    return (y * 2).sum()


def scale_on_a_comm_stream(g: torch.Tensor, comm: torch.Stream, main: torch.Stream) -> None:
    comm.wait_stream(main)
    with comm:
        g.mul_(0.5)
    main.wait_stream(comm)


def _write_back_then_join(gm: torch.fx.GraphModule) -> list[str]:
    """The graph's write-backs into inputs and its last wait_stream, in issue order."""
    order = {node: i for i, node in enumerate(gm.graph.nodes)}
    copies = [
        n
        for n in gm.graph.nodes
        if n.target is torch.ops.aten.copy_.default and n.args[0].op == "placeholder"
    ]
    join = [s.node for s in syncs(gm) if s.name == "wait_stream"][-1]
    return [
        ("copy_" if n in copies else "wait_stream")
        for n in sorted([*copies, join], key=order.__getitem__)
    ]


def _streams() -> tuple[SimStream, SimStream]:
    return SimStream(device="cpu"), SimStream(device="cpu")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_buffer_updated_on_a_side_stream_is_written_before_the_join(backend: str) -> None:
    x, w, ema = torch.randn(4), torch.randn(4, requires_grad=True), torch.ones(4)
    expected_ema = ema * 0.9 + (x * w).detach() * 0.1
    forward = capture(ema_on_a_side_stream, x, w, ema.clone(), *_streams(), backend=backend)
    assert _write_back_then_join(forward.forward[0]) == ["copy_", "wait_stream"]

    compiled_ema = ema.clone()
    loss = torch.compile(ema_on_a_side_stream, backend=backend)(x, w, compiled_ema, *_streams())
    (grad,) = torch.autograd.grad(loss, w)
    torch.testing.assert_close(compiled_ema, expected_ema)
    torch.testing.assert_close(grad, 2 * x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_gradient_scaled_on_a_comm_stream_is_written_before_the_join(backend: str) -> None:
    """The hook of a DDP-style overlap: compiled without autograd, an inference graph."""
    forward = capture(scale_on_a_comm_stream, torch.ones(4), *_streams(), backend=backend)
    assert _write_back_then_join(forward.forward[0]) == ["copy_", "wait_stream"]

    g = torch.full((4,), 3.0)
    torch.compile(scale_on_a_comm_stream, backend=backend)(g, *_streams())
    torch.testing.assert_close(g, torch.full((4,), 1.5))


def ema_read_against_its_clone(
    x: torch.Tensor, w: torch.Tensor, ema: torch.Tensor, side: torch.Stream, main: torch.Stream
) -> torch.Tensor:
    previous = ema.clone()
    y = x * w
    with side:
        ema.mul_(0.5)
        ema.add_(y.detach() * 0.5)
    main.wait_stream(side)
    return (y * 2).sum() + (ema - previous).sum()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_clone_of_the_old_value_read_after_the_update_keeps_the_old_value(
    backend: str, requires_grad: bool
) -> None:
    """Inductor replaces a clone of an input by the input, trusting that updates come last:
    a write-back moved above the clone's reader made it read the new value (40.0, not 30.0)."""
    x, w = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.full((4,), 2.0, requires_grad=requires_grad)
    ema, compiled_ema = torch.full((4,), 10.0), torch.full((4,), 10.0)
    expected = ema_read_against_its_clone(x, w, ema, *_streams())
    compiled = torch.compile(ema_read_against_its_clone, backend=backend)
    torch.testing.assert_close(compiled(x, w, compiled_ema, *_streams()), expected)
    torch.testing.assert_close(compiled_ema, ema)


def ema_read_after_the_join(
    x: torch.Tensor, w: torch.Tensor, ema: torch.Tensor, side: torch.Stream, main: torch.Stream
) -> torch.Tensor:
    with side:
        ema.mul_(0.9)
    main.wait_stream(side)
    return (x * w + ema).sum()  # the caller's stream reads the new value: why it joined


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_a_buffer_whose_new_value_is_read_after_the_join_is_written_before_it(
    backend: str, requires_grad: bool
) -> None:
    """A read of the new value needs only the value, not the input: counting it kept the
    write-back after the read, after the join, so the join did not cover it (review by
    helper-31)."""
    x, w = torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.full((4,), 2.0, requires_grad=requires_grad)
    ema, compiled_ema = torch.full((4,), 10.0), torch.full((4,), 10.0)
    expected = ema_read_after_the_join(x, w, ema, *_streams())
    forward = capture(
        ema_read_after_the_join, x, w, torch.full((4,), 10.0), *_streams(), backend=backend
    )
    assert _write_back_then_join(forward.forward[0]) == ["copy_", "wait_stream"]
    compiled = torch.compile(ema_read_after_the_join, backend=backend)
    torch.testing.assert_close(compiled(x, w, compiled_ema, *_streams()), expected)
    torch.testing.assert_close(compiled_ema, ema)


def swap_through_a_clone(
    a: torch.Tensor, b: torch.Tensor, side: torch.Stream, main: torch.Stream
) -> None:
    old_a = a.clone()
    with side:
        a.copy_(b)
        b.copy_(old_a)
    main.wait_stream(side)


@pytest.mark.parametrize("backend", BACKENDS)
def test_write_backs_that_read_each_others_old_values_keep_their_order(backend: str) -> None:
    """Each write-back reads the other input's old value: no order of the two is right, and
    moving them wrote b from the new a (1, 1 where eager gives 2, 1). They stay in
    AOTAutograd's order, which ``userstreams_aot_eager`` runs right; native Inductor, which
    replaces the clone by a, gives (2, 2) with or without streams (review by helper-31)."""
    a, b = torch.full((4,), 1.0), torch.full((4,), 2.0)
    forward = capture(swap_through_a_clone, a.clone(), b.clone(), *_streams(), backend=backend)
    copies = [n for n in forward.forward[0].graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert [c.args[0].name for c in copies] == ["arg0_1", "arg1_1"]
    assert [r for c in copies for r in records(c)] == []
    if backend == "userstreams_aot_eager":
        torch.compile(swap_through_a_clone, backend=backend)(a, b, *_streams())
        torch.testing.assert_close((a, b), (torch.full((4,), 2.0), torch.full((4,), 1.0)))


def snapshot_of_a_view_read_after_the_join(
    x: torch.Tensor, ema: torch.Tensor, side: torch.Stream, main: torch.Stream
) -> torch.Tensor:
    snapshot = ema[:2] + torch.zeros(2)
    with side:
        ema.mul_(0.5)
    main.wait_stream(side)
    return snapshot * 3 + x


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_old_value_that_inductor_turns_into_a_view_of_the_input_keeps_it(backend: str) -> None:
    """Inductor replaces ``view + zeros`` by the view: a write-back moved above its reader made
    it read the new value ([1.5, 3] for eager's [3, 6]) with userstreams (helper-32). Only a
    node that reaches the input through the new value alone may follow the write-back."""
    x, ema, compiled_ema = torch.zeros(2), torch.arange(1.0, 5.0), torch.arange(1.0, 5.0)
    expected = snapshot_of_a_view_read_after_the_join(x, ema, *_streams())
    compiled = torch.compile(snapshot_of_a_view_read_after_the_join, backend=backend)
    torch.testing.assert_close(compiled(x, compiled_ema, *_streams()), expected)
    torch.testing.assert_close(compiled_ema, ema)
