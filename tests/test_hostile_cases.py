"""Cases a hostile user found: silent wrong objects and unclear crashes around object
lifetimes, install state, leaked annotations and errors. Each failed on the package before
its fix; the comment at each test says what it did then."""

from __future__ import annotations

import contextlib
import gc
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch._dynamo.testing
import torch.fx
from helpers import doubled_on_a_side_stream, forget_bindings, last_binding
from pass_programs import simulated_eager

import torch_userstreams
from torch_userstreams.compile.table import Phase
from torch_userstreams.errors import NotCompilingError, UserObjectError
from torch_userstreams.fx.meta import stream_of
from torch_userstreams.run import binding as bindings
from torch_userstreams.run.backward import BINDING_ATTR
from torch_userstreams.simulator import SimEvent, SimStream
from torch_userstreams.testing import capture, check_stream_safety
from torch_userstreams.testing.capture import no_compile_caches
from torch_userstreams.testing.fake_accelerator import FakeAcceleratorStream, fake_accelerator
from torch_userstreams.testing.objects import live_user_objects

BACKENDS = ("userstreams_aot_eager", "userstreams", "aot_eager")


def side(x: torch.Tensor, w: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        y = (x * w).sin()
    return (y * w).sum()


def two_streams(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
    with s1:
        y = x.sin()
    with s2:
        z = y.cos()
    return (z * 2).sum()


def leaves() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.rand(4, generator=gen, requires_grad=True) for _ in range(2))  # type: ignore[return-value]


def eager_grads(fn: Callable[..., torch.Tensor], *args: Any) -> list[torch.Tensor]:
    tensors = [a.detach().clone().requires_grad_() for a in args if isinstance(a, torch.Tensor)]
    others = [a for a in args if not isinstance(a, torch.Tensor)]
    fn(*tensors, *others).backward()
    return [t.grad for t in tensors]  # type: ignore[misc]


def binding_on(out: torch.Tensor) -> bindings.Binding:
    """The binding the call that made ``out`` left on its autograd nodes."""
    todo = [out.grad_fn]
    while todo:
        node = todo.pop()
        binding = getattr(node, BINDING_ATTR, None)
        if binding is not None:
            return binding  # type: ignore[no-any-return]
        todo.extend(fn for fn, _ in node.next_functions if fn is not None)
    raise AssertionError("no binding on the call's autograd nodes")


def backward_events(binding: bindings.Binding) -> list[Any]:
    entries = bindings.graph_of(binding).table.entries
    return [bindings.objects_of(binding)[e.index] for e in entries if e.phase is Phase.BACKWARD]


# 1. A stream passed as a temporary: calls 1 and 2 raised "no longer alive when the
#    backward needs it" (the backward held inputs weakly).
@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_stream_passed_as_a_temporary(backend: str) -> None:
    compiled = torch.compile(side, backend=backend)
    x, w = leaves()
    for _ in range(3):
        out = compiled(x, w, SimStream(device="cpu"))
        forget_bindings()  # the test's spy would keep the stream alive
        gc.collect()
        out.backward()
    want = eager_grads(side, x, w, SimStream(device="cpu"))
    torch.testing.assert_close((x.grad, w.grad), tuple(3 * g for g in want))
    forget_bindings()
    before = live_user_objects()
    for _ in range(20):
        compiled(x, w, SimStream(device="cpu")).backward()
    forget_bindings()
    assert live_user_objects() - before <= 0, "+0 live objects per training step"


# 2. Outputs made through a chain of views: the backward raised native's "Index not
#    registered" (the binding search stopped four nodes up the autograd graph).
def view_chain(x: torch.Tensor, s: torch.Stream) -> tuple[torch.Tensor, torch.Tensor]:
    with s:
        z = x.sin() * 2
    v = z
    for _ in range(6):
        v = v.unsqueeze(0).squeeze(0)
    return v, z.detach()


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_through_chains_of_views(backend: str) -> None:
    x = torch.rand(4, requires_grad=True)
    v, _ = torch.compile(view_chain, backend=backend)(x, SimStream(device="cpu"))
    if backend == "userstreams":
        _no_backward_events_on_cpu(v)
    else:
        # The backward's edge syncs, issued by both aot_eager backends on the call's events.
        events = backward_events(binding_on(v))
        v.sum().backward()
        assert events and all(event.recorded for event in events)
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())


def _no_backward_events_on_cpu(v: torch.Tensor) -> None:
    """userstreams on CPU compiles both graphs without their syncs (stream order is program
    order): the events the passes requested for the backward's syncs are not made. The one
    call enters the call's streams in the backward, found through the binding on the
    output's nodes."""
    binding = last_binding()
    table = bindings.graph_of(binding).table
    requested = [e for e in table.entries if e.phase is Phase.BACKWARD]
    assert requested and not any(table.loads(e.index) for e in requested)
    assert all(bindings.objects_of(binding)[e.index] is None for e in requested)
    assert binding_on(v) is binding
    v.sum().backward()


# 3. uninstall() while a backward is pending: A's backward waits landed on the streams of
#    B, a forward made after uninstall() (or raised native's AssertionError without B).
#    On the fake accelerator, so that ``userstreams`` issues its syncs (on CPU it has none).
@pytest.mark.parametrize("backend", BACKENDS)
def test_uninstall_while_a_backward_is_pending(backend: str) -> None:
    with fake_accelerator():
        _uninstall_while_a_backward_is_pending(backend)


def _uninstall_while_a_backward_is_pending(backend: str) -> None:
    torch_userstreams.install()
    compiled = torch.compile(two_streams, backend=backend)
    x = torch.rand(4, requires_grad=True)
    a_streams = FakeAcceleratorStream(), FakeAcceleratorStream()
    b_streams = FakeAcceleratorStream(), FakeAcceleratorStream()
    a = compiled(x, *a_streams)
    a_binding = binding_on(a)
    torch_userstreams.uninstall()
    b = compiled(x, *b_streams)
    a.backward()
    own = {id(obj) for obj in bindings.objects_of(a_binding)}
    used = [stream for event in backward_events(a_binding) for _, stream in event.log]
    assert used and all(id(stream) in own for stream in used)
    b.backward()
    torch.testing.assert_close(x.grad, 2 * eager_grads(two_streams, x, *a_streams)[0])


# 4. install() from another thread while a function compiles: every later call of it
#    synchronized the first call's streams; uninstall() mid-compile failed for want of triton.
def record_and_wait(
    x: torch.Tensor, s1: torch.Stream, s2: torch.Stream, done: torch.Event
) -> torch.Tensor:
    with s1:
        y = x + 1
    done.record(s1)
    done.wait(s2)
    with s2:
        return y * 2


@pytest.mark.parametrize("change", ["install", "uninstall"])
def test_install_state_changes_wait_for_a_compile_in_flight(change: str) -> None:
    if change == "uninstall":
        torch_userstreams.install()
    compiling, release = threading.Event(), threading.Event()

    def slow_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiling.set()
        assert release.wait(10)
        return gm

    compiled = torch.compile(record_and_wait, backend=slow_backend)
    calls = [(SimStream(device="cpu"), SimStream(device="cpu"), SimEvent(device="cpu"))]
    compiler = threading.Thread(target=lambda: compiled(torch.ones(2), *calls[0]))
    changed = threading.Event()
    changer = threading.Thread(target=lambda: (getattr(torch_userstreams, change)(), changed.set()))
    compiler.start()
    assert compiling.wait(10)
    changer.start()
    assert not changed.wait(0.5), f"{change}() returned while a compile was in flight"
    release.set()
    compiler.join()
    changer.join()
    assert changed.is_set()
    calls.append((SimStream(device="cpu"), SimStream(device="cpu"), SimEvent(device="cpu")))
    torch.testing.assert_close(compiled(torch.ones(2), *calls[1]), torch.full((2,), 4.0))
    for s1, s2, done in calls:
        # ("wait", s2) from event.wait(s2); torch 2.11's native op calls s2.wait_event(event),
        # which the simulator logs on the event as ("waited_by", s2).
        assert [stream for _, stream in done.log] == [s1, s2], "each call syncs its own streams"


class StallingEvent(SimEvent):
    """Records only once the test lets it: holds a compiled call in flight."""

    entered = threading.Event()
    release = threading.Event()

    def record(self, stream: torch.Stream | None = None) -> None:  # type: ignore[override]
        StallingEvent.entered.set()
        assert StallingEvent.release.wait(10)
        super().record(stream)


@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "aot_eager"])
def test_uninstall_lets_a_call_on_another_thread_finish_first(backend: str) -> None:
    torch_userstreams.install()
    compiled = torch.compile(record_and_wait, backend=backend)
    warm = (SimStream(device="cpu"), SimStream(device="cpu"), SimEvent(device="cpu"))
    compiled(torch.ones(2), *warm)  # compiled while installed
    s1, s2, done = SimStream(device="cpu"), SimStream(device="cpu"), StallingEvent(device="cpu")
    StallingEvent.entered.clear()
    StallingEvent.release.clear()
    results: list[torch.Tensor] = []
    caller = threading.Thread(target=lambda: results.append(compiled(torch.ones(2), s1, s2, done)))
    uninstalled = threading.Event()
    uninstaller = threading.Thread(
        target=lambda: (torch_userstreams.uninstall(), uninstalled.set())
    )
    caller.start()
    assert StallingEvent.entered.wait(10)
    uninstaller.start()
    assert not uninstalled.wait(0.3), "uninstall() returned while a compiled call was running"
    StallingEvent.release.set()
    caller.join()
    uninstaller.join()
    assert uninstalled.is_set()
    torch.testing.assert_close(results[0], torch.full((2,), 4.0))
    assert [stream for _, stream in done.log] == [s1, s2], "the call synced its own streams"


# 5. A stream annotation leaked by a failed trace (`with s1: with s2: with s1:`) annotated
#    every node of the next compiled function with stream 0 of the failed graph.
@contextlib.contextmanager
def a_leaked_stream_annotation(index: int) -> Iterator[None]:
    """``fx.traceback.annotate({"stream": index})`` entered as Dynamo enters a stream block
    and left open around the code under test, as a trace that fails inside the block
    without exiting it leaves it (upstream Dynamo's "multiple exits?" on
    ``with s1, s2, s1:`` did, before ``patch.stream_blocks``). Closed afterwards."""
    from torch.fx import traceback as fx_traceback

    annotation = fx_traceback.annotate({"stream": index})
    preserved = fx_traceback.preserve_node_meta()
    annotation.__enter__()
    preserved.__enter__()
    try:
        yield
    finally:
        preserved.__exit__(None, None, None)
        annotation.__exit__(None, None, None)


def stream_free(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_a_leaked_stream_annotation_is_dropped(backend: str) -> None:
    from torch.fx import traceback as fx_traceback

    with a_leaked_stream_annotation(1):
        assert fx_traceback.current_meta["custom"] == {"stream": 1}
        torch._dynamo.reset()
        x = torch.rand(3)
        compiled = torch.compile(stream_free, backend=backend)
        torch.testing.assert_close(compiled(x), stream_free(x))
        assert "stream" not in fx_traceback.current_meta.get("custom", {})


def loss(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x * w).sin().sum()


@pytest.mark.usefixtures("installed")
def test_a_leaked_annotation_met_outside_a_compile_is_named_and_dropped() -> None:
    """A trace outside Dynamo (``aot_function``) of a function with no streams, after the
    leak and before any frame compile dropped it: its nodes carry the annotation, and the
    error said the graph had user streams and to compile it with torch.compile."""
    from functorch.compile import aot_function, nop

    x, w = leaves()
    with a_leaked_stream_annotation(0):
        with pytest.raises(NotCompilingError, match=r"annotation \{'stream': 0\} that an earli"):
            aot_function(loss, fw_compiler=nop, bw_compiler=nop)(x, w).backward()
        aot_function(loss, fw_compiler=nop, bw_compiler=nop)(x, w).backward()
    torch.testing.assert_close(x.grad, eager_grads(loss, x, w)[0])


def test_an_annotation_naming_no_stream_of_the_graph_is_rejected() -> None:
    from torch_userstreams.compile.hook import check_streams
    from torch_userstreams.compile.table import EntryKind, UserObjectTable
    from torch_userstreams.fx.meta import set_stream

    table = UserObjectTable("g")
    event = torch.Event(device="cpu")
    table.add(EntryKind.GRAPH_CREATED, "an event", lambda cg: None, event, added_by="test")
    graph = torch.fx.Graph()
    node = graph.call_function(torch.sin, (graph.placeholder("x"),))
    for index, what in ((0, "graph-created"), (3, "nothing")):
        set_stream(node, index)
        with pytest.raises(
            UserObjectError, match=rf"node sin of graph g .* stream {index}.*{what}"
        ):
            check_streams(graph, table)


# 6. Installing changed eager code: eager torch.cond whose branch enters a stream failed in
#    backward with native's "Index not registered".
def cond_with_stream(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    def on_stream(x: torch.Tensor) -> torch.Tensor:
        with s:
            return x.sin()

    def plain(x: torch.Tensor) -> torch.Tensor:
        return x.cos()

    return torch.cond(x.sum() > 0, on_stream, plain, (x,)).sum()


def test_installing_does_not_change_eager_cond() -> None:
    values = torch.rand(3)
    grads = []
    for install in (False, True):
        if install:
            torch_userstreams.install()
        x = values.clone().requires_grad_()
        cond_with_stream(x, SimStream(device="cpu")).backward()
        grads.append(x.grad)
        torch._dynamo.reset()
    torch.testing.assert_close(grads[1], grads[0])
    torch.testing.assert_close(grads[0], values.cos())


# 7. Clear errors: lookup(999) raised native's AssertionError and lookup('x') a TypeError.
@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    ("index", "why"),
    [
        (999, "it is past the end of the table (an index from another graph's compile?)"),
        ("x", "an index is an int, not str"),
        (-1, "indices start at 0"),
        (1.0, "an index is an int, not float"),
    ],
)
def test_a_bad_lookup_raises_the_package_error(index: Any, why: str) -> None:
    with pytest.raises(UserObjectError, match=rf"lookup\({index!r}\)"):
        torch_userstreams.lookup(index)

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        def run(*args: Any) -> Any:  # a lookup the graph does not show: checked per call
            torch_userstreams.lookup(index)
            return gm(*args)

        return run

    with pytest.raises(
        UserObjectError, match=rf"graph side .* no user object at index {index!r}"
    ) as exc:
        torch.compile(side, backend=backend)(*leaves(), SimStream(device="cpu"))
    assert f"entries): {why}. Use the index that new_stream()" in str(exc.value)


SEEN: list[Any] = []


def seen(obj: Any) -> None:  # a graph node's target: importable by name
    SEEN.append(obj)


@pytest.mark.usefixtures("installed")
def test_a_graph_reading_an_index_its_backend_never_requested_fails_to_compile() -> None:
    """Such a graph has an empty table and binds nothing: called inside another compiled
    call, its lookup(0) silently returned that call's object 0."""
    SEEN.clear()

    def read_object_0(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
        with gm.graph.inserting_after(placeholder):
            found = gm.graph.call_function(torch_userstreams.lookup, (0,))
        with gm.graph.inserting_after(found):
            gm.graph.call_function(seen, (found,))
        gm.recompile()
        return gm

    inner = torch.compile(lambda x: x + 1, backend=read_object_0)

    def outer_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        torch_userstreams.new_event(device="cpu")

        def run(*args: Any) -> Any:
            inner(args[0])
            return gm(*args)

        return run

    outer = torch.compile(lambda x: x * 2, backend=outer_backend)
    expected = (
        r"UserObjectError: torch_userstreams: graph \S+ \[\d+/\d+\] reads user object\(s\) 0 "
        r"after its backend ran, but its table has 0 entries"
    )
    with pytest.raises(Exception, match=expected):
        outer(torch.ones(2))
    assert SEEN == []


@pytest.mark.usefixtures("installed")
def test_explain_leaves_other_compiled_functions_alone() -> None:
    compiles: list[int] = []

    def counting(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiles.append(1)
        return gm

    other = torch.compile(stream_free, backend=counting)
    other(torch.ones(2))
    for _ in range(2):  # a second explain of the same function compiles it again
        report = torch_userstreams.explain(side, *leaves(), SimStream(device="cpu"))
        assert len(report.tables) == 1
    other(torch.ones(2))
    assert len(compiles) == 1, "explain() made the other function recompile"


@pytest.mark.usefixtures("installed")
def test_backward_bindings_are_released_with_the_autograd_graph() -> None:
    compiled = torch.compile(side, backend="userstreams_aot_eager")
    x, w = leaves()
    compiled(x, w, SimStream(device="cpu")).backward()
    forget_bindings()
    gc.collect()
    before = live_user_objects()
    out = compiled(x, w, SimStream(device="cpu"))
    assert live_user_objects() > before
    out.backward()
    del out
    forget_bindings()
    assert live_user_objects() == before


def doubled_on(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        y = x.sin() * 2
    return y + 1


def viewed_on(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        y = x.t()
    return y + 1


def back_on_its_own_main_stream(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    main = torch.Stream(device="cpu")  # the demo's CPU blocks make their main stream
    s.wait_stream(main)
    with s:
        a = x.sin()
    main.wait_stream(s)
    with main:
        return a + x.cos()


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("fn", [doubled_on, back_on_its_own_main_stream], ids=lambda f: f.__name__)
@no_compile_caches()  # Inductor's cache keys native code by the graph, not by our codegen
def test_native_inductor_runs_cpu_work_on_a_user_stream(fn: Callable[..., Any]) -> None:
    """Inductor 2.12+ enters ``stream1`` (or ``default_stream``, for a stream the function
    made and entered last) in its CPU code, and defined those names only inside a GPU
    device guard: every call of such a graph failed with ``NameError: name 'stream1' is not
    defined``, natively too. While installed the code defines them (``patch.
    launch_code``) from the call's objects, and issues each sync as their method.
    Inductor 2.11 ignores the annotation, natively and installed (the package places only
    the graphs its own backend compiles, ``inductor.placed_streams``); it freed a buffer before
    the ``sync_dealloc`` that holds it (``UnboundLocalError``) until each sync flushed only
    the kernel gathered before it, not the frees (``sync_order.flushed_at_syncs``)."""
    from torch._inductor.utils import run_and_get_code

    # A simulated stream: Inductor 2.11 keeps the graph's wait_stream, which a native CPU
    # stream cannot run (no CPU events), natively too.
    x, s = torch.rand(3, 2, requires_grad=True), SimStream(device="cpu")
    with simulated_eager():
        expected = fn(x, s)
    (expected_grad,) = torch.autograd.grad(expected.sum(), x)
    out, code = run_and_get_code(torch.compile(fn, backend="inductor"), x, s)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], expected_grad)
    if torch.__version__.startswith("2.11."):
        # One stream (no block), its syncs as ops: values right, nothing overlaps.
        assert "with user_object" not in code[0] and "torch.ops.streams" in code[0], code[0]
    else:
        forward = code[0]
        assert "default_stream = nullcontext()" in forward
        assert re.search(r"\n +stream1 = user_object\d+\n", forward), forward
        resolved = r"\n +(user_object\d+, )+= lookup_user_objects\(\((\d+, )*\d+,\)\)\n"
        assert re.search(resolved, forward), forward
        # Entered as itself on every release (2.12 wrote torch.cuda.stream(stream1), which
        # does nothing without CUDA).
        assert "\n        with stream1:\n" in forward and "torch.cuda.stream(" not in forward
        # Each sync is the method of the call's objects, resolved once: no op dispatch.
        assert "torch.ops.streams" not in forward, forward
        if fn is back_on_its_own_main_stream:
            waits = r"\n +user_object\d+\.wait_stream\(user_object\d+\)\n"
            assert len(re.findall(waits, forward)) == 2, forward
    fixed = torch.compile(fn, backend="userstreams")
    torch.testing.assert_close(fixed(x, s), expected)
    # Only a view on the stream: no kernel runs there, and Inductor's code works.
    torch.testing.assert_close(torch.compile(viewed_on, backend="inductor")(x, s), viewed_on(x, s))


@pytest.mark.usefixtures("installed")
def test_native_inductors_stream_code_beside_an_unbacked_size() -> None:
    """Inductor names an unbacked size ``u0`` in the same generated function that resolves
    the call's user objects: the objects' names must not be ``u0``, ``u1``..."""
    from torch._inductor.utils import run_and_get_code

    def counted_on(x: torch.Tensor, s: torch.Stream) -> tuple[torch.Tensor, torch.Tensor]:
        with s:
            y = x * 2
        return y.sin(), torch.nonzero(x > 0.5)

    x, s = torch.rand(6), SimStream(device="cpu")
    with simulated_eager():
        expected = counted_on(x, s)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        out, code = run_and_get_code(torch.compile(counted_on, backend="inductor"), x, s)
    torch.testing.assert_close(out, expected)
    if not torch.__version__.startswith("2.11."):
        assert any(re.search(r"\n +u0 = ", c) for c in code), code
        assert any("user_object" in c for c in code), code


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("eager_calls", [1, "more than a foreign backend is watched for"])
def test_a_backend_that_runs_its_first_calls_eagerly_keeps_later_backwards_bound(
    eager_calls: int | str,
) -> None:
    """Warm-up calls made only C++ autograd nodes. The package once stopped handing later
    calls' bindings to their backward after one (which then failed with 'outside any
    compiled call'); AOTAutograd traced this graph's backward, so it never stops."""
    from torch._dynamo.backends.registry import lookup_backend

    from torch_userstreams.compile.table import HandOver
    from torch_userstreams.run.bound_graph import CALLS_WITHOUT_A_PYTHON_NODE

    warm_up = eager_calls if isinstance(eager_calls, int) else CALLS_WITHOUT_A_PYTHON_NODE + 1

    def step(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
        return doubled_on_a_side_stream(x, side) * 3

    def warm_up_first(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        compiled = lookup_backend("userstreams_aot_eager")(gm, example_inputs)
        calls = [0]

        def run(*args: Any) -> Any:
            calls[0] += 1
            return gm(*args) if calls[0] <= warm_up else compiled(*args)

        return run

    compiled = torch.compile(step, backend=warm_up_first)
    side = SimStream(device="cpu")
    for seed in range(warm_up + 2):
        x = torch.rand(3, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        compiled(x, side).sum().backward()
        torch.testing.assert_close(x.grad, 6 * torch.cos(2 * x.detach()))
    bound = last_binding()[0]
    assert bound.table.plan.hand_over is HandOver.EVERY_CALL
    assert bound.after_forward is not None and bound.misses == 0


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize(
    ("mistake", "expected"),
    [
        (
            "swapped sync",
            "the sync record_event takes an event as argument 0, but user object 1 is a SimStream",
        ),
        ("event annotation", "a node runs on user object 0 (a SimEvent), which is not a stream"),
    ],
)
def test_a_backend_naming_the_wrong_kind_of_object_gets_the_package_error(
    mistake: str, expected: str
) -> None:
    """It failed inside torch or the executor: AttributeError 'SimStream' object has no
    attribute 'record', or TypeError: 'SimEvent' does not support the context manager
    protocol."""
    from torch._dynamo.backends.registry import lookup_backend

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        event = torch_userstreams.new_event(device="cpu")
        stream = torch_userstreams.new_stream(device="cpu")
        if mistake == "swapped sync":
            placeholder = [n for n in gm.graph.nodes if n.op == "placeholder"][-1]
            with gm.graph.inserting_after(placeholder):
                gm.graph.call_function(torch.ops.streams.record_event.default, (stream, event))
        else:
            for node in gm.graph.nodes:
                if node.op == "call_function":
                    node.meta.setdefault("custom", {})["stream"] = event
        gm.recompile()
        return lookup_backend("userstreams_aot_eager")(gm, example_inputs)

    x = torch.ones(2, requires_grad=True)
    with pytest.raises(UserObjectError, match=r"in graph <lambda> \[0/0\], ") as exc:
        torch.compile(lambda x: (x + 1).sin(), backend=backend)(x).sum().backward()
    assert expected in str(exc.value)
    assert "event indices from new_event()" in str(exc.value)


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend_name", ["userstreams_aot_eager", "userstreams"])
def test_a_stream_annotation_that_is_not_an_index_is_refused(backend_name: str) -> None:
    """``"0"`` was read as no annotation: the node silently ran on the current stream."""
    from torch._dynamo.backends.registry import lookup_backend

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        stream = torch_userstreams.new_stream(device="cpu")
        for node in gm.graph.nodes:
            if node.op == "call_function":
                node.meta.setdefault("custom", {})["stream"] = str(stream)
        gm.recompile()
        return lookup_backend(backend_name)(gm, example_inputs)

    x = torch.ones(2, requires_grad=True)
    expected = r"node add \(.*\) is annotated to run on stream '0' \(str\), which is not a table"
    with pytest.raises(Exception, match=expected):
        torch.compile(lambda x: (x + 1).sin(), backend=backend)(x).sum().backward()


@pytest.mark.usefixtures("installed")
def test_a_graph_that_never_makes_a_python_node_stops_walking_after_a_few_calls() -> None:
    """The hand-over walks every autograd node a call made (about 1 us each): a backend that
    always runs the graph eagerly pays it only until the limit, then never again."""
    from torch_userstreams.compile.table import HandOver
    from torch_userstreams.run.bound_graph import CALLS_WITHOUT_A_PYTHON_NODE

    def step(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
        with side:
            return (x * 2).sin()

    compiled = torch.compile(step, backend="eager")
    side = SimStream(device="cpu")
    x = torch.ones(3, requires_grad=True)
    for _ in range(CALLS_WITHOUT_A_PYTHON_NODE - 1):
        compiled(x, side).sum().backward()
    bound = last_binding()[0]
    assert bound.table.plan.hand_over is HandOver.WHILE_FOUND  # no AOTAutograd: watched
    assert bound.after_forward is not None and bound.misses == CALLS_WITHOUT_A_PYTHON_NODE - 1
    compiled(x, side).sum().backward()
    assert bound.after_forward is None
    torch.testing.assert_close(x.grad, CALLS_WITHOUT_A_PYTHON_NODE * 2 * torch.cos(2 * x.detach()))


def _add_side_work_then_view(x: torch.Tensor, w: torch.Tensor, s: torch.Stream, view: str) -> Any:
    with s:
        t = (w * 2).tanh()
    x += t
    if view == "slice":
        return x[1:]
    if view == "view.t":
        return x.view(2, 2).t()
    return x.view(2, 2), x.sum()


def _training_run(fn: Callable[..., Any], view: str, stream: torch.Stream) -> list[torch.Tensor]:
    torch.manual_seed(0)
    a, w = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    x = a * 1.5  # a non-leaf input, updated in place
    outs = fn(x, w, stream, view)
    outs = outs if isinstance(outs, tuple) else (outs,)
    sum((out * (i + 2)).sum() for i, out in enumerate(outs)).backward()
    return [*(out.detach() for out in outs), x.detach(), a.grad, w.grad]


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("view", ["slice", "view.t", "view and a reduction"])
@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
@pytest.mark.parametrize("device", ["cpu", "fake accelerator"])
def test_a_view_of_an_input_updated_beside_side_work_is_a_forward_output(
    backend: str, view: str, device: str
) -> None:
    """AOTAutograd rebuilds such a view after the backward, untagged; the package tagged it
    backward, made it wait for the backward, and the partitioner raised "AssertionError:
    Node getitem_3 was invalid, but is output" (native aot_eager compiled it)."""
    expected = _training_run(_add_side_work_then_view, view, SimStream(device="cpu"))
    compiled = torch.compile(_add_side_work_then_view, backend=backend)
    if device == "cpu":
        got = _training_run(compiled, view, SimStream(device="cpu"))
    else:
        with fake_accelerator():
            got = _training_run(compiled, view, FakeAcceleratorStream())
    for value, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(value, reference)


def _update_a_buffer_then_view(
    x: torch.Tensor, w: torch.Tensor, s: torch.Stream
) -> tuple[torch.Tensor, torch.Tensor]:
    with s:
        x[1:].mul_(2)
        y = x * w
    return y, x[:3]


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
@pytest.mark.parametrize("device", ["cpu", "fake accelerator"])
def test_a_view_of_a_buffer_updated_on_a_side_stream_is_a_forward_output(
    backend: str, device: str
) -> None:
    """An input that needs no gradient gets its new value inside the graph (a ``copy_``),
    not as an output; the view of it AOTAutograd rebuilds after the backward was tagged
    backward, and the partitioner raised "AssertionError: Node getitem_2 was invalid, but
    is output" (found by helper-13; native aot_eager compiled it)."""

    def run(fn: Callable[..., Any], stream: torch.Stream) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(4)
        x, w = torch.randn(6, generator=gen), torch.randn(6, generator=gen, requires_grad=True)
        y, view = fn(x, w, stream)
        (y * view.sum()).sum().backward()
        return [y.detach(), view, x, w.grad]

    expected = run(_update_a_buffer_then_view, SimStream(device="cpu"))
    compiled = torch.compile(_update_a_buffer_then_view, backend=backend)
    if device == "cpu":
        got = run(compiled, SimStream(device="cpu"))
    else:
        with fake_accelerator():
            got = run(compiled, FakeAcceleratorStream())
    for value, reference in zip(got, expected, strict=True):
        torch.testing.assert_close(value, reference)


class _GradientFromASideValue(torch.autograd.Function):
    """A backward that ignores its incoming gradient and joins the side stream before it
    reads a value the side stream wrote."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, y: torch.Tensor, streams: Any) -> torch.Tensor:
        ctx.save_for_backward(y)
        ctx.streams = streams
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (y,) = ctx.saved_tensors
        main, side = ctx.streams
        main.wait_stream(side)
        return y.cos(), None, None


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_a_custom_backward_that_ignores_its_gradient_stays_after_its_join(backend: str) -> None:
    """Its nodes read only forward values and feed only outputs, like a rebuilt output view:
    the rule for those moved ``y.cos()`` into the forward, ahead of the join."""
    main, side = SimStream(device="cpu"), SimStream(device="cpu")

    def program(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
        with side:
            y = x.detach() * 2
        return _GradientFromASideValue.apply(x, y, (main, side))

    x = torch.linspace(0, 1, 3, requires_grad=True)
    result = capture(program, x, side, backend=backend)
    torch.testing.assert_close(x.grad, (2 * torch.linspace(0, 1, 3)).cos())
    backward = [n.target for n in result.backward[0].graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.cos.default in backward
    for _, gm in result.graphs:
        assert check_stream_safety(gm).findings == []


def random_on_a_side_stream(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    joined = torch.Event(device=x.device)
    with side:
        noise = torch.rand(8)
    joined.record(side)
    joined.wait()
    return (x * noise).sum()


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_a_step_draws_the_random_numbers_eager_draws(backend: str) -> None:
    """With ``fallback_random`` (eager's RNG), the global generator after a forward and
    backward is where eager leaves it. ``userstreams_aot_eager`` partitioned with
    ``default_partition``, which copied the (impure) ``rand`` into the backward: a dead draw
    there moved every later random number."""
    x = torch.linspace(-1, 1, 8)

    def next_draw(fn: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        leaf = x.clone().requires_grad_()
        torch.manual_seed(0)
        fn(leaf, SimStream(device="cpu")).backward()
        assert leaf.grad is not None
        return leaf.grad, torch.rand(3)

    with torch._inductor.config.patch(fallback_random=True):
        with simulated_eager():
            want = next_draw(random_on_a_side_stream)
        got = next_draw(torch.compile(random_on_a_side_stream, backend=backend))
        leaf, side = x.clone().requires_grad_(), SimStream(device="cpu")
        result = capture(random_on_a_side_stream, leaf, side, backend=backend)
    torch.testing.assert_close(got, want)
    backward = result.backward[0].graph.nodes
    assert not [n for n in backward if n.target is torch.ops.aten.rand.default]


class LinearOnASideStream(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.Stream(device="cpu"):
            y = self.lin(x) * 2
        return y.relu() + 1


@pytest.mark.usefixtures("installed")
def test_a_strict_export_module_names_the_annotations_it_kept() -> None:
    """A strict export drops the stream but keeps its nodes' annotations; compiling its
    module said 'leaked from another trace; call torch._dynamo.reset()', which cannot help."""
    torch.manual_seed(0)
    model, x = LinearOnASideStream(), torch.randn(3, 4)
    exported = torch.export.export(model, (x,), strict=True).module()
    message = r"torch_userstreams: node \w+ of graph .* strict torch\.export.*strict=False"
    with pytest.raises(Exception, match=message):  # Dynamo wraps it: InternalTorchDynamoError
        torch.compile(exported, backend="userstreams")(x)
    for node in exported.graph.nodes:  # the fix the error gives
        node.meta.get("custom", {}).pop("stream", None)
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(exported, backend="userstreams")(x), model(x))


def record_a_passed_event(x: torch.Tensor, side: torch.Stream, ev: Any) -> torch.Tensor:
    with side:
        y = x * 2
    ev.record(side)
    ev.wait()
    return y


def join_a_passed_stream(x: torch.Tensor, side: torch.Stream, main: Any) -> torch.Tensor:
    with side:
        y = x * 2
    main.wait_stream(side)
    return y


@pytest.mark.parametrize(
    ("fn", "native", "simulated", "named"),
    [
        (record_a_passed_event, torch.Event, SimEvent, "(L['ev']) is a native CPU torch.Event"),
        (join_a_passed_stream, torch.Stream, SimStream, "(L['main']) is a native CPU torch.Stream"),
    ],
)
def test_a_native_cpu_object_passed_in_is_named_with_the_fix(
    fn: Callable[..., torch.Tensor], native: type, simulated: type, named: str
) -> None:
    """torch said only "cpu backend doesn't support events" (helper-35, helper-36); eager
    code fails the same way, so the error says what stands in for the object."""
    torch_userstreams.install()
    compiled = torch.compile(fn, backend="userstreams_aot_eager")
    with pytest.raises(UserObjectError) as exc:
        compiled(torch.ones(2), SimStream(device="cpu"), native(device="cpu"))
    message = str(exc.value)
    assert f"in graph {fn.__name__} [0/0], user object" in message
    assert named in message
    assert f"torch_userstreams.simulator.{simulated.__name__}(device='cpu')" in message
    got = compiled(torch.ones(2), SimStream(device="cpu"), simulated(device="cpu"))
    torch.testing.assert_close(got, torch.full((2,), 2.0))


def test_a_sync_steps_own_lookup_error_is_raised_once() -> None:
    """The package's errors are RuntimeErrors too: the diagnosis of a failed step looked the
    same index up again and raised a second error while handling the first (helper-36)."""
    from torch_userstreams.run.issue_syncs import ISSUERS
    from torch_userstreams.run.plan import Program, Step

    program = Program(1, [0], [Step(ISSUERS["record_event"], (0, 1))], None)
    with pytest.raises(UserObjectError, match="outside any compiled call") as exc:
        program.run([None])
    assert exc.value.__context__ is None


def nested_blocks(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        a = x.sin()
        with s:  # a helper making sure it runs on the side stream, already current
            b = a * 2
        c = b + 1  # still on s after the inner block
    return c.exp()


@pytest.mark.parametrize("accelerator", [False, True], ids=["cpu", "fake-accelerator"])
@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_a_stream_block_nested_in_its_own_block_runs_on_it(backend: str, accelerator: bool) -> None:
    """Dynamo failed with ``AssertionError: multiple exits?`` (helper-51)."""
    x = torch.randn(5, requires_grad=True)
    with fake_accelerator() if accelerator else contextlib.nullcontext():
        s = FakeAcceleratorStream() if accelerator else SimStream(device="cpu")
        run = capture(nested_blocks, x, s, backend=backend)
        ex = x.detach().clone().requires_grad_()
        expected = nested_blocks(ex, s)
        expected.sum().backward()
    torch.testing.assert_close(run.result, expected)
    torch.testing.assert_close(x.grad, ex.grad)
    (forward,) = run.forward
    (table,) = run.tables
    (entry,) = [e for e in table.entries if e.origin == "L['s']"]
    on_s = {n.target for n in forward.graph.nodes if stream_of(n) == entry.index}
    aten = torch.ops.aten
    assert {aten.sin.default, aten.mul.Tensor, aten.add.Tensor} <= on_s, forward.graph
    assert aten.exp.default not in on_s, forward.graph


def reentered_across_another(x: torch.Tensor, s: torch.Stream, t: torch.Stream) -> torch.Tensor:
    with s:
        with t:
            with s:
                y = x.sin()
    return y


@pytest.mark.usefixtures("installed")
def test_a_stream_reentered_while_another_is_current_is_a_graph_break_naming_it() -> None:
    s, t = SimStream(device="cpu"), SimStream(device="cpu")
    compiled = torch.compile(reentered_across_another, backend="userstreams", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported) as info:
        compiled(torch.ones(2), s, t)
    message = str(info.value)
    assert "(L['s']) nested in a block of the same stream" in message, message
    assert "entered again while the innermost block is not this stream's" in message, message
    assert "Drop the inner `with L['s']:`" in message, message
    assert "the function's own code runs eagerly" in message, message


@pytest.mark.usefixtures("installed")
def test_without_fullgraph_a_reentered_stream_runs_the_function_eagerly() -> None:
    """What the graph break's message says happens: Dynamo cannot resume inside the block,
    so no graph compiles, and the result is eager's."""
    s, t = SimStream(device="cpu"), SimStream(device="cpu")
    counter = torch._dynamo.testing.CompileCounterWithBackend("userstreams")
    out = torch.compile(reentered_across_another, backend=counter)(torch.ones(2), s, t)
    assert counter.frame_count == 0
    assert torch.equal(out, reentered_across_another(torch.ones(2), s, t))


@torch.compiler.nested_compile_region
def region_on_its_stream(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        return x.sin()


def region_called_on_the_same_stream(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        y = region_on_its_stream(x, s)
    return region_on_its_stream(y, s)


@pytest.mark.usefixtures("installed")
def test_a_stream_reentered_in_a_region_body_is_refused_naming_it() -> None:
    """Traced on the stream, the inner block would be invisible in the body, which the
    second call reuses off the stream: its work would silently leave the stream."""
    compiled = torch.compile(region_called_on_the_same_stream, backend="userstreams_aot_eager")
    with pytest.raises(torch._dynamo.exc.TorchDynamoException) as info:
        compiled(torch.ones(2), SimStream(device="cpu"))
    message = str(info.value)
    assert "entered again inside the body of a higher-order op" in message, message
