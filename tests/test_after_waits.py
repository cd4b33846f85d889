"""``inductor.after_waits``: which values a wait's ``control_deps`` holds move after it, on
hand-built graphs shaped as torch 2.12+ wraps its syncs (event 0, stream 2 waits), and that
values are kept; then the demo's step, compiled. Every generated program that
``test_races`` compiles as one call on 2.12+ goes through the pass under the race detector."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.fx
from helpers import demo_step_kernels

from torch_userstreams.backends.inductor_graphs import inductor_runs_streams
from torch_userstreams.fx.control_deps import is_control_deps
from torch_userstreams.inductor.after_waits import computed_after_waits

pytestmark = pytest.mark.skipif(
    not inductor_runs_streams(),
    reason="control_deps wraps syncs from torch 2.12 on; on 2.11 the package places the "
    "nodes itself (inductor.early_values)",
)

aten, streams = torch.ops.aten, torch.ops.streams


def _control_deps() -> Any:
    from torch._inductor.fx_passes.control_dependencies import control_deps

    return control_deps


class Builder:
    """An FX graph whose syncs are wrapped in ``control_deps``, as torch 2.12+ wraps them."""

    def __init__(self) -> None:
        self.root = torch.nn.Module()
        self.graph = torch.fx.Graph()
        self.x = self.graph.placeholder("x")

    def op(self, target: Any, *args: Any) -> torch.fx.Node:
        return self.graph.call_function(target, args)

    def sync(
        self, target: Any, deps: tuple[Any, ...], operands: tuple[torch.fx.Node, ...]
    ) -> list[torch.fx.Node]:
        """``target(0, 2)`` (event or stream 0; stream 2) wrapped in control_deps over
        ``deps``, passing ``operands`` through; their passthroughs."""
        sub = torch.fx.Graph()
        held = [sub.placeholder(f"dep_{i}") for i in range(len(operands))]
        sub.output((sub.call_function(target, (0, 2)), *held))
        name = f"subgraph_{len(self.root._modules)}"
        self.root.add_module(name, torch.fx.GraphModule(torch.nn.Module(), sub))
        wrapped = self.op(_control_deps(), tuple(deps), self.graph.get_attr(name), *operands)
        return [self.op(operator.getitem, wrapped, i + 1) for i in range(len(operands))]

    def wait(self, deps: tuple[Any, ...], *operands: torch.fx.Node) -> list[torch.fx.Node]:
        return self.sync(streams.wait_event.default, deps, operands)

    def module(self, *outputs: torch.fx.Node) -> torch.fx.GraphModule:
        self.graph.output(outputs)
        return torch.fx.GraphModule(self.root, self.graph)


SYNCS = (
    streams.wait_event.default,
    streams.record_event.default,
    streams.wait_stream.default,
    streams.sync_dealloc.default,
)


class WithoutSyncs(torch.fx.Interpreter):
    """Runs a graph's ops on CPU, its syncs as no-ops; a control_deps runs its subgraph (what
    it returns is what its passthroughs read)."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target is _control_deps():
            return tuple(WithoutSyncs(args[1]).run(*args[2:]))
        if target in SYNCS:
            return None
        return super().call_function(target, args, kwargs)


def order(gm: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in gm.graph.nodes if n.op == "call_function"]


def values(gm: torch.fx.GraphModule) -> list[torch.Tensor]:
    torch.manual_seed(0)
    return list(WithoutSyncs(gm).run(torch.randn(4, 4)))


def wait_node(gm: torch.fx.GraphModule) -> torch.fx.Node:
    return next(n for n in gm.graph.nodes if is_control_deps(n))


def mask_before_a_wait(
    between: Callable[[Builder, torch.fx.Node], Any] | None = None,
    mask: Callable[[Builder], torch.fx.Node] | None = None,
) -> torch.fx.GraphModule:
    """``le(x, 0)`` (or ``mask``) held by a wait, ``between`` them what the test puts there;
    a ``where`` after the wait reads the mask's passthrough."""
    b = Builder()
    made = mask(b) if mask is not None else b.op(aten.le.Scalar, b.x, 0)
    if between is not None:
        between(b, made)
    (passed,) = b.wait((b.x, made), made)
    zero = b.op(aten.full.default, [], 0.0)
    return b.module(b.op(aten.where.self, passed, zero, b.x))


def test_a_mask_held_by_a_wait_is_computed_after_it_and_read_directly() -> None:
    gm = mask_before_a_wait()
    before = values(gm)
    moved = computed_after_waits(gm)
    assert [n.name for n in moved] == ["le_scalar"]
    assert order(gm) == ["control_deps", "le_scalar", "full_default", "where_self"]
    wait = wait_node(gm)
    assert wait.args[0] == (gm.graph.find_nodes(op="placeholder")[0],)  # x only
    assert wait.args[2:] == ()  # no operand left
    subgraph = getattr(gm, str(wait.args[1].target))
    assert [n.op for n in subgraph.graph.nodes] == ["call_function", "output"]
    where = next(n for n in gm.graph.nodes if n.name == "where_self")
    assert where.args[0] is moved[0]
    assert [torch.equal(a, b) for a, b in zip(values(gm), before, strict=True)] == [True]


def test_a_chain_moves_together_and_the_other_passthroughs_are_renumbered() -> None:
    """``1 - t * t`` moves with its product; the kept operand after it is read at its new
    index."""
    b = Builder()
    kept = b.op(aten.relu.default, b.x)
    b.op(streams.sync_dealloc.default, 1, 0, kept)  # stops the walk: ``kept`` stays
    square = b.op(aten.mul.Tensor, b.x, b.x)
    derivative = b.op(aten.rsub.Scalar, square, 1)
    derivative_passed, kept_passed = b.wait((b.x, kept, square, derivative), derivative, kept)
    wait = derivative_passed.args[0]
    assert isinstance(wait, torch.fx.Node)
    wait.meta["val"] = ("sync", "derivative", "kept")
    gm = b.module(b.op(aten.mul.Tensor, derivative_passed, kept_passed))
    subgraph = getattr(gm, str(wait.args[1].target))
    before = values(gm)
    assert [n.name for n in computed_after_waits(gm)] == ["mul_tensor", "rsub_scalar"]
    assert order(gm)[-5:] == [
        "control_deps",
        "mul_tensor",
        "rsub_scalar",
        "getitem_1",
        "mul_tensor_1",
    ]
    getitem = next(n for n in gm.graph.nodes if n.name == "getitem_1")
    assert getitem.args[1] == 1 and wait.args[2:] == (kept,)  # was item 2
    assert wait.meta["val"] == ("sync", "kept")
    fresh = getattr(gm, str(wait.args[1].target))
    assert [n.op for n in fresh.graph.nodes] == ["placeholder", "call_function", "output"]
    assert len([n for n in subgraph.graph.nodes if n.op == "placeholder"]) == 2  # not edited
    assert [torch.equal(a, b) for a, b in zip(values(gm), before, strict=True)] == [True]


def test_a_constant_the_wait_holds_is_let_go_where_it_is() -> None:
    """A ``full`` that another node reads too, and a sync between: it stays in place (it reads
    nothing), and what read its passthrough reads it."""
    b = Builder()
    zero = b.op(aten.full.default, [], 0.0)
    b.op(streams.sync_dealloc.default, 1, 0, b.x)
    (passed,) = b.wait((b.x, zero), zero)
    gm = b.module(b.op(aten.maximum.default, b.x, passed), b.op(aten.neg.default, zero))
    before = values(gm)
    assert computed_after_waits(gm) == [zero]
    assert order(gm) == [
        "full_default",
        "sync_dealloc_default",
        "control_deps",
        "maximum_default",
        "neg_default",
    ]
    assert wait_node(gm).args[2:] == ()
    maximum = next(n for n in gm.graph.nodes if n.name == "maximum_default")
    assert maximum.args[1] is zero
    assert [torch.equal(a, b) for a, b in zip(values(gm), before, strict=True)] == [True, True]


def test_a_value_read_before_the_wait_or_past_a_sync_or_a_write_stays() -> None:
    def read_between(b: Builder, mask: torch.fx.Node) -> None:
        b.op(aten.logical_not.default, mask)

    def dealloc_between(b: Builder, mask: torch.fx.Node) -> None:
        b.op(streams.sync_dealloc.default, 1, 0, b.x)

    def write_between(b: Builder, mask: torch.fx.Node) -> None:
        b.op(aten.add_.Tensor, b.x, 1)

    for between in (read_between, dealloc_between, write_between):
        gm = mask_before_a_wait(between)
        before = order(gm)
        assert computed_after_waits(gm) == [], between.__name__
        assert order(gm) == before


def test_a_random_or_in_place_value_stays() -> None:
    def random(b: Builder) -> torch.fx.Node:
        return b.op(aten.bernoulli.p, b.x, 0.5)

    def in_place(b: Builder) -> torch.fx.Node:
        return b.op(aten.le_.Scalar, b.x, 0)

    for mask in (random, in_place):
        gm = mask_before_a_wait(mask=mask)
        assert computed_after_waits(gm) == [], mask.__name__


@pytest.mark.parametrize("sync", ["record_event", "wait_stream"])
def test_a_record_or_a_wait_for_a_stream_keeps_the_values_it_covers(sync: str) -> None:
    """``wait_stream(2, 1)`` covers the work stream 1 issued before it, as a record would."""
    b = Builder()
    value = b.op(aten.relu.default, b.x)
    (passed,) = b.sync(getattr(streams, sync).default, (b.x, value), (value,))
    gm = b.module(b.op(aten.neg.default, passed))
    assert computed_after_waits(gm) == []


def test_a_wait_left_with_no_dependency_keeps_its_values() -> None:
    b = Builder()
    mask = b.op(aten.le.Scalar, b.x, 0)
    (passed,) = b.wait((mask,), mask)
    gm = b.module(b.op(aten.where.self, passed, b.x, b.x))
    assert computed_after_waits(gm) == []


def step_kernels(after_waits: bool, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from torch_userstreams.backends import inductor_graphs

    if not after_waits:
        monkeypatch.setattr(inductor_graphs, "computed_after_waits", lambda gm: [])
    kernels = demo_step_kernels()
    monkeypatch.undo()
    return kernels


def test_the_demo_backwards_derivatives_fuse_into_the_kernels_that_read_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the move, each block's ``1 - tanh**2``, and the first ReLU's mask with its
    zero, were kernels of their own in the backward, before the waits that held them (20 C++
    kernels in the step; 17 with it)."""
    without = step_kernels(False, monkeypatch)
    with_move = step_kernels(True, monkeypatch)
    assert len(with_move) == len(without) - 3, (without, with_move)
