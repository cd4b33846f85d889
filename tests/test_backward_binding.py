"""Each backward resolves user objects against the binding of its own forward call."""

from __future__ import annotations

import gc
import threading
import weakref
from typing import Any

import pytest
import torch
from helpers import backward_events, forget_bindings, last_binding

import torch_userstreams
from torch_userstreams.compile.table import Phase
from torch_userstreams.run import bound_graph
from torch_userstreams.run.binding import graph_of, objects_of
from torch_userstreams.run.bound_graph import CALLS_WITHOUT_A_PYTHON_NODE
from torch_userstreams.simulator import SimStream
from torch_userstreams.testing.objects import live_user_objects

pytestmark = pytest.mark.usefixtures("installed")
BACKEND = "userstreams_aot_eager"


def two_streams(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    side = torch.Stream(device="cpu")
    with side:
        y = x * w
    return (y.sin() * w).sum()


def input_stream(x: torch.Tensor, w: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        y = (x * w).cos()
    return (y * w).sum()


def leaves(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(4, generator=gen, requires_grad=True)
    w = torch.rand(4, generator=gen, requires_grad=True)
    return x, w


def eager_grads(fn, *args) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    tensors = [a.detach().clone().requires_grad_(True) for a in args[:2]]
    fn(*tensors, *args[2:]).backward()
    return [t.grad for t in tensors]  # type: ignore[misc]


def recorded(events: list) -> int:  # type: ignore[type-arg]
    return sum(len(e.log) for e in events)


def forward(fn, *args):  # type: ignore[no-untyped-def]
    out = fn(*args)
    return out, last_binding()


def test_fwd_a_fwd_b_bwd_b_bwd_a() -> None:
    compiled_a = torch.compile(two_streams, backend=BACKEND)
    compiled_b = torch.compile(input_stream, backend=BACKEND)
    (xa, wa), (xb, wb) = leaves(0), leaves(1)
    s = SimStream(device="cpu")
    out_a, bind_a = forward(compiled_a, xa, wa)
    out_b, bind_b = forward(compiled_b, xb, wb, s)
    events_a, events_b = backward_events(bind_a), backward_events(bind_b)
    assert events_a and events_b
    assert recorded(events_a) == recorded(events_b) == 0
    out_b.backward()
    assert recorded(events_b) > 0 and recorded(events_a) == 0
    out_a.backward()
    assert recorded(events_a) > 0
    for got, want in zip([xa.grad, wa.grad], eager_grads(two_streams, xa, wa), strict=True):
        torch.testing.assert_close(got, want)
    for got, want in zip([xb.grad, wb.grad], eager_grads(input_stream, xb, wb, s), strict=True):
        torch.testing.assert_close(got, want)


def test_one_function_with_a_graph_break(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        first = two_streams(x, w)
        torch._dynamo.graph_break()
        return first * two_streams(w, x)

    compiled = torch.compile(broken, backend=BACKEND)
    x, w = leaves(2)
    bindings: list = []  # type: ignore[type-arg]
    spied_runner = bound_graph.runner

    def runner(bound: bound_graph.BoundGraph):  # type: ignore[no-untyped-def]
        run = spied_runner(bound)

        def spy(*args):  # type: ignore[no-untyped-def]
            out = run(*args)
            bindings.append(last_binding())
            return out

        return spy

    monkeypatch.setattr(bound_graph, "runner", runner)
    out = compiled(x, w)
    assert len({id(graph_of(b)) for b in bindings}) == 2, "two graphs, each with its own table"
    out.backward()
    assert all(recorded(backward_events(b)) > 0 for b in bindings)
    for got, want in zip([x.grad, w.grad], eager_grads(broken, x, w), strict=True):
        torch.testing.assert_close(got, want)


def test_gradient_accumulation_fwd1_fwd2_bwd2_bwd1() -> None:
    compiled = torch.compile(two_streams, backend=BACKEND)
    x, w = leaves(3)
    out1, bind1 = forward(compiled, x, w)
    out2, bind2 = forward(compiled, x, w)
    events1, events2 = backward_events(bind1), backward_events(bind2)
    assert not {id(e) for e in events1} & {id(e) for e in events2}, "fresh events per call"
    out2.backward()
    assert recorded(events2) > 0 and recorded(events1) == 0
    out1.backward()
    assert recorded(events1) == recorded(events2)
    want = eager_grads(two_streams, x, w)
    torch.testing.assert_close(x.grad, 2 * want[0])
    torch.testing.assert_close(w.grad, 2 * want[1])


def test_retain_graph_and_a_second_backward() -> None:
    compiled = torch.compile(two_streams, backend=BACKEND)
    x, w = leaves(4)
    out, binding = forward(compiled, x, w)
    out.backward(retain_graph=True)
    once = recorded(backward_events(binding))
    out.backward()
    assert recorded(backward_events(binding)) == 2 * once > 0
    torch.testing.assert_close(x.grad, 2 * eager_grads(two_streams, x, w)[0])


def test_backward_on_another_thread() -> None:
    compiled = torch.compile(two_streams, backend=BACKEND)
    x, w = leaves(5)
    out, binding = forward(compiled, x, w)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.backward()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert errors == []
    assert recorded(backward_events(binding)) > 0
    torch.testing.assert_close(x.grad, eager_grads(two_streams, x, w)[0])


def test_autograd_grad() -> None:
    compiled = torch.compile(two_streams, backend=BACKEND)
    x, w = leaves(6)
    out, binding = forward(compiled, x, w)
    gx, gw = torch.autograd.grad(out, (x, w))
    assert recorded(backward_events(binding)) > 0
    want = eager_grads(two_streams, x, w)
    torch.testing.assert_close(gx, want[0])
    torch.testing.assert_close(gw, want[1])


def test_a_backward_node_applied_directly_uses_its_own_call() -> None:
    """``out.grad_fn.apply(grad)`` runs the node without the autograd engine, so no node is
    current: lookups found no binding ("outside any compiled call"; helper-33)."""
    compiled = torch.compile(two_streams, backend=BACKEND)
    (xa, wa), (xb, wb) = leaves(8), leaves(9)
    out_a, bind_a = forward(compiled, xa, wa)
    _, bind_b = forward(compiled, xb, wb)
    gx, gw = out_a.grad_fn.apply(torch.ones(()))[:2]
    assert recorded(backward_events(bind_a)) > 0
    assert recorded(backward_events(bind_b)) == 0
    want = eager_grads(two_streams, xa, wa)
    torch.testing.assert_close(gx, want[0])
    torch.testing.assert_close(gw, want[1])


def test_a_node_applied_from_another_nodes_hook_uses_its_own_call() -> None:
    """The engine's current node is A's while its hook applies B's node: B's backward used
    A's objects (helper-36)."""
    compiled = torch.compile(two_streams, backend=BACKEND)
    (xa, wa), (xb, wb) = leaves(10), leaves(11)
    out_a, bind_a = forward(compiled, xa, wa)
    out_b, bind_b = forward(compiled, xb, wb)
    applied = []
    out_a.register_hook(lambda grad: applied.append(out_b.grad_fn.apply(torch.ones(()))))
    out_a.backward()
    assert recorded(backward_events(bind_a)) == recorded(backward_events(bind_b)) > 0
    gx, gw = applied[0][:2]
    want = eager_grads(two_streams, xb, wb)
    torch.testing.assert_close(gx, want[0])
    torch.testing.assert_close(gw, want[1])


def test_live_objects_stay_bounded_over_10000_training_steps() -> None:
    compiled = torch.compile(two_streams, backend=BACKEND)
    x, w = leaves(7)
    for _ in range(20):
        compiled(x, w).backward()
    before = live_user_objects()
    for _ in range(10_000):
        compiled(x, w).backward()
    after = live_user_objects()
    assert after - before <= 2, (before, after)


def test_input_stream_deleted_before_the_backward_still_serves_it() -> None:
    """As in eager, the autograd graph keeps the streams its ops ran on: the binding held by
    the backward node keeps the input stream alive until the backward has run."""
    compiled = torch.compile(input_stream, backend=BACKEND)
    x, w = leaves(8)
    compiled(x, w, SimStream(device="cpu")).backward()  # compile (guards may hold the first)
    x.grad = w.grad = None
    doomed = SimStream(device="cpu")
    alive = weakref.ref(doomed)
    out = compiled(x, w, doomed)
    forget_bindings()
    del doomed
    gc.collect()
    assert alive() is not None, "held by the pending backward"
    out.backward()
    del out
    gc.collect()
    assert alive() is None, "released with the autograd graph"
    torch.testing.assert_close(x.grad, eager_grads(input_stream, x, w, SimStream(device="cpu"))[0])


def test_explain_marks_backward_objects() -> None:
    x, w = leaves(9)
    report = torch_userstreams.explain(two_streams, x, w, backend=BACKEND)
    (table,) = report.tables
    phases = {entry.phase for entry in table.entries}
    assert phases == {Phase.FORWARD, Phase.BACKWARD}
    text = str(report)
    assert "backward" in text and "added by backward_syncs" in text


RETURNS = {
    "nothing": lambda other: None,
    "an_input_with_history": lambda other: other,
    "a_view_of_it": lambda other: other.view(-1),
}


@pytest.mark.parametrize("returns", RETURNS)
@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_backward_through_an_input_mutated_in_place(
    backend: str, returns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No output leads to the call's backward node: the backward hangs on the mutated input's
    history, and still resolves the call's own stream (it raised "called outside any compiled
    call", or silently took native's table's objects)."""

    def mutate_on_stream(x: torch.Tensor, s: torch.Stream, other: torch.Tensor) -> object:
        with s:
            y = (x * 2).exp()
        x.add_(y)
        return RETURNS[returns](other)

    from torch_userstreams.testing.fake_accelerator import FakeAcceleratorStream, fake_accelerator

    entered: list[torch.Stream] = []
    enter = FakeAcceleratorStream.__enter__

    def logged_enter(self: FakeAcceleratorStream) -> None:
        entered.append(self)
        enter(self)

    monkeypatch.setattr(FakeAcceleratorStream, "__enter__", logged_enter)
    with fake_accelerator():  # the regions of userstreams run on accelerator streams
        leaf = torch.rand(4, requires_grad=True)
        x = leaf * 1
        stream = FakeAcceleratorStream()
        other = torch.rand(4, requires_grad=True) * 1
        torch.compile(mutate_on_stream, backend=backend)(x, stream, other)
        entered.clear()
        x.sum().backward()
    torch.testing.assert_close(leaf.grad, 1 + 2 * (2 * leaf.detach()).exp())
    assert entered and all(s is stream for s in entered), "the call's own stream"


class _Node:
    """An autograd node stand-in whose inputs must not be listed."""

    def __init__(self, number: int) -> None:
        self.number = number

    def _sequence_nr(self) -> int:
        return self.number

    @property
    def next_functions(self) -> tuple:  # type: ignore[type-arg]
        raise AssertionError("the walk listed the inputs of the only node the call made")


class _Out(torch.Tensor):
    """A tensor whose ``grad_fn`` is a stand-in node."""

    node: _Node

    @property  # type: ignore[override]
    def grad_fn(self) -> _Node:
        return self.node


def test_the_walk_stops_once_it_found_every_node_the_call_made() -> None:
    from torch_userstreams.run.backward import nodes_made

    # A call that made one node: its inputs (the parameters' nodes) are never listed.
    out = torch.zeros(1).as_subclass(_Out)
    out.node = node = _Node(7)
    assert list(nodes_made(out, 7, 8, inputs=())) == [node]
    # An output whose own node is older (not the call's): nothing, as the walk never passes
    # a node outside the call's range.
    assert list(nodes_made(out, 8, 9, inputs=())) == []
    # A call that made four nodes in a chain: the walk goes on until it has all four.
    x = torch.rand(3, requires_grad=True)
    first = torch._C._autograd._get_sequence_nr()
    y = ((x * 2).sin() + 1).sum()
    last = torch._C._autograd._get_sequence_nr()
    names = [type(n).__name__ for n in nodes_made(y, first, last, inputs=(x,))]
    assert last - first == 4
    assert names == ["SumBackward0", "AddBackward0", "SinBackward0", "MulBackward0"]


def test_userstreams_on_cpu_makes_no_backward_events() -> None:
    """``userstreams`` compiles a CPU table's graphs as one call without their syncs, each
    node on its stream, so the prologue skips the events requested for the backward's syncs.
    The one call's backward enters the call's streams: each call binds it. Gradients stay
    eager's."""
    from torch_userstreams.run.backward import BINDING_ATTR

    x, w = leaves(11)
    report = torch_userstreams.explain(two_streams, x, w, backend="userstreams")
    (table,) = report.tables
    requested = [e for e in table.entries if e.phase is Phase.BACKWARD]
    assert requested and not any(table.loads(e.index) for e in requested)
    assert table.plan is not None and table.plan.backward_bound
    assert "added by backward_syncs) (unused: not loaded)" in str(report)
    compiled = torch.compile(two_streams, backend="userstreams")
    out = compiled(x, w)
    binding = getattr(out.grad_fn, BINDING_ATTR, None)
    assert binding is not None
    assert all(objects_of(binding)[e.index] is None for e in requested)
    out.backward()
    torch.testing.assert_close([x.grad, w.grad], eager_grads(two_streams, *leaves(11)))


def test_a_graph_compiled_after_the_prologue_may_not_read_what_it_does_not_load() -> None:
    """The load plan is made when the frame's compile ends; a backward compiled later that
    read a skipped object, or read any while calls hand it no binding, would find nothing."""
    from torch_userstreams.compile.graph_compile import GraphCompile
    from torch_userstreams.compile.load_plan import plan_loads, report_reads
    from torch_userstreams.compile.table import EntryKind, HandOver, Reader, UserObjectTable
    from torch_userstreams.errors import UserObjectError
    from torch_userstreams.simulator import SimEvent

    compile_ = GraphCompile(UserObjectTable("g"))
    table = compile_.table
    table.add(EntryKind.INPUT, "s", lambda cg: None, SimStream(device="cpu"), added_by="test")
    event = table.add(
        EntryKind.REQUESTED,
        "a sync event",
        lambda cg: None,
        SimEvent(device="cpu"),
        added_by="test",
        phase=Phase.BACKWARD,
    )
    assert table.entries[event].reader is Reader.ADDED_NODES  # a request: nodes read it
    report_reads(compile_, {0}, backward=False)  # the forward, compiled first
    assert compile_.reported_reads == {0}
    table.plan = plan_loads(table, {0}, compile_.reported_reads, backward_traced=True)
    assert [table.loads(e.index) for e in table.entries] == [True, False]
    assert table.plan.hand_over is HandOver.EVERY_CALL  # the forward reads the stream
    report_reads(compile_, set(), backward=True)  # reads nothing: fine
    assert compile_.reported_reads == {0}, "the plan is made: later reports change nothing"
    with pytest.raises(UserObjectError, match=r"backward of graph g, compiled after .* 1 "):
        report_reads(compile_, {1}, backward=True)

    unbound = GraphCompile(UserObjectTable("h"))
    unbound.table.add(
        EntryKind.INPUT, "s", lambda cg: None, SimStream(device="cpu"), added_by="test"
    )
    report_reads(unbound, set(), backward=False)
    unbound.table.plan = plan_loads(
        unbound.table, {0}, unbound.reported_reads, backward_traced=True
    )
    assert unbound.table.plan.hand_over is HandOver.NONE
    with pytest.raises(UserObjectError, match=r"backward of graph h, .* reads user object\(s\) 0"):
        report_reads(unbound, {0}, backward=True)


def stage_two(
    x: torch.Tensor, w: torch.Tensor, s: torch.Stream
) -> tuple[torch.Tensor, torch.Tensor]:
    with s:
        y = (x * w).cos()
    return (y * w).sum(), x.view(-1)


def test_an_input_made_on_another_thread_with_one_of_the_calls_numbers() -> None:
    """Autograd sequence numbers count per thread: an input made on a fresh thread carries a
    number the call's own nodes carry on another fresh thread. The walk from the outputs
    reached the input's node first (through the returned view), took it for the call's, and
    skipped the compiled node with the same number: the backward found no binding, and after
    32 such calls the graph stopped handing bindings over, on every thread."""
    compiled = torch.compile(stage_two, backend=BACKEND)
    leaf, w = leaves(12)
    compiled(leaf * 1, w, SimStream(device="cpu"))  # compiles on this thread
    for _ in range(CALLS_WITHOUT_A_PYTHON_NODE + 1):
        step = _pipeline_step(compiled, leaf, w)
        assert step["collides"], "the scenario: the input's node carries one of the call's numbers"
        assert step["own streams"], "the backward synced on this call's streams"
        torch.testing.assert_close(step["grads"], _stage_two_grads(leaf, w))
    leaf.grad = w.grad = None
    a, v = compiled(leaf * 1, w, SimStream(device="cpu"))
    (a + v.sum()).backward()
    torch.testing.assert_close([leaf.grad, w.grad], _stage_two_grads(leaf, w))


def _pipeline_step(compiled: Any, leaf: torch.Tensor, w: torch.Tensor) -> dict[str, Any]:
    """Stage one makes the input on a fresh thread; stage two, on another, calls ``compiled``
    and runs the backward."""
    step: dict[str, Any] = {}

    def stage_one() -> None:
        step["x"] = leaf * 1

    def run_stage_two() -> None:
        try:
            call_and_backward()
        except Exception as exc:  # re-raised on the test's thread
            step["error"] = exc

    def call_and_backward() -> None:
        x, s = step["x"], SimStream(device="cpu")
        first = torch._C._autograd._get_sequence_nr()
        a, v = compiled(x, w, s)
        last = torch._C._autograd._get_sequence_nr()
        step["collides"] = first <= x.grad_fn._sequence_nr() < last
        binding = last_binding()
        leaf.grad = w.grad = None
        (a + v.sum()).backward()
        step["grads"] = [leaf.grad, w.grad]
        own = {id(obj) for obj in objects_of(binding)}
        used = [stream for event in backward_events(binding) for _, stream in event.log]
        step["own streams"] = bool(used) and all(id(stream) in own for stream in used)

    for stage in (stage_one, run_stage_two):
        thread = threading.Thread(target=stage)
        thread.start()
        thread.join()
    if "error" in step:
        raise step["error"]
    return step


def _stage_two_grads(leaf: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    x2, w2 = (t.detach().clone().requires_grad_(True) for t in (leaf, w))
    a, v = stage_two(x2 * 1, w2, SimStream(device="cpu"))
    (a + v.sum()).backward()
    return [x2.grad, w2.grad]  # type: ignore[list-item]


def _run_engine_directly(out: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """A backward started on the engine itself, as Megatron's ``custom_backward`` does (no
    ``torch.autograd`` frame in between)."""
    engine = torch.autograd.Variable._execution_engine  # type: ignore[attr-defined]
    (found,) = engine.run_backward(
        (out,), (torch.ones_like(out),), False, False, (inputs,), True, False
    )
    return found  # type: ignore[no-any-return]


def _autograd_grad(out: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    (found,) = torch.autograd.grad(out, inputs)
    return found


@pytest.mark.parametrize("run_backward", [_autograd_grad, _run_engine_directly])
def test_a_backward_run_inside_another_nodes_apply_is_named_by_the_engine(
    run_backward: Any,
) -> None:
    """A pre-hook of a node that a backward inside another node's ``apply`` runs belongs to
    that inner node (the engine's current node), not to the outer ``apply`` frame, however
    that backward was started; code inside each ``apply`` is named by its own node."""
    from torch_userstreams.run.backward import BINDING_ATTR, backward_binding

    seen: list[object] = []

    class Inner(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x * 2

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            seen.append(("inner apply", backward_binding()))
            return grad * 2

    class Outer(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
            seen.append(("outer apply", backward_binding()))
            y = torch.ones(2, requires_grad=True)
            with torch.enable_grad():  # a backward runs without grad mode
                inner = Inner.apply(y)
                setattr(inner.grad_fn, BINDING_ATTR, "inner call")
                inner.grad_fn.register_prehook(
                    lambda g: seen.append(("pre-hook", backward_binding()))
                )
                found = run_backward(inner.sum(), y)
            return grad * found

    x = torch.ones(2, requires_grad=True)
    out = Outer.apply(x)
    setattr(out.grad_fn, BINDING_ATTR, "outer call")
    out.sum().backward()
    assert seen == [
        ("outer apply", "outer call"),
        ("pre-hook", "inner call"),
        ("inner apply", "inner call"),
    ]
    assert backward_binding() is None  # outside any backward
