"""Per-graph tables and per-call bindings across the paths torch.compile takes."""

from __future__ import annotations

import time

import pytest
import torch
import torch.fx
from helpers import run_threads
from probes import insert_probe, node_of, probe, seen, stream_input_indices

import torch_userstreams
from torch_userstreams import simulator
from torch_userstreams.simulator import SimEvent, SimStream
from torch_userstreams.testing.objects import live_user_objects


def stream_and_event(x: torch.Tensor) -> tuple[torch.Tensor, torch.Stream, torch.Event]:
    side = torch.Stream(device="cpu")
    done = torch.Event(device="cpu")
    with side:
        y = x * 2
    done.record(side)
    return y + 1, side, done


def probe_inputs(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
    insert_probe(gm, stream_input_indices(gm))
    return gm


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_graph_created_objects_are_fresh_per_call_and_returned(backend: str) -> None:
    def make(x: torch.Tensor) -> tuple[torch.Tensor, torch.Stream, torch.Event]:
        side = torch.Stream(device="cpu")
        done = torch.Event(device="cpu")
        return x.sin(), side, done

    compiled = torch.compile(make, backend=backend)
    results = [compiled(torch.ones(2)) for _ in range(3)]
    for y, side, done in results:
        assert torch.allclose(y, torch.ones(2).sin())
        assert isinstance(side, SimStream) and isinstance(done, SimEvent)
    assert len({id(side) for _, side, _ in results}) == 3
    assert len({id(done) for _, _, done in results}) == 3


def enters_as(x: torch.Tensor, passed: torch.Stream) -> tuple[object, ...]:
    with passed as entered:
        made = torch.Stream(device="cpu")
        with made as entered_made:
            y = x * 2
        done = torch.Event(device="cpu")
        done.record(entered_made)
    done.wait()
    return y + 1, entered, made, entered_made, done


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["eager", "aot_eager", "userstreams", "userstreams_aot_eager"])
def test_with_stream_as_name_binds_the_stream_as_in_eager(backend: str) -> None:
    """``with s as t:`` binds ``t`` to ``s``; Dynamo bound None (helper-51)."""
    passed = SimStream(device="cpu")
    compiled = torch.compile(enters_as, backend=backend, fullgraph=True)
    for _ in range(2):
        y, entered, made, entered_made, done = compiled(torch.ones(2), passed)
        assert torch.equal(y, torch.full((2,), 3.0))
        assert entered is passed
        assert isinstance(made, SimStream) and entered_made is made
        if backend != "userstreams":  # which drops CPU syncs: program order makes them moot
            assert done.log[0] == ("record", made), "recorded on the stream entered as a name"


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_syncs_resolve_to_this_calls_objects(backend: str) -> None:
    compiled = torch.compile(stream_and_event, backend=backend)
    for _ in range(3):
        y, side, done = compiled(torch.ones(2))
        assert torch.equal(y, torch.full((2,), 3.0))
        assert done.log == [("record", side)], "recorded on this call's own side stream"


@pytest.mark.usefixtures("installed")
def test_live_objects_stay_bounded_over_10000_calls() -> None:
    def make_and_sync(x: torch.Tensor) -> torch.Tensor:
        side = torch.Stream(device="cpu")
        done = torch.Event(device="cpu")
        with side:
            y = x + 1
        done.record(side)
        return y

    compiled = torch.compile(make_and_sync, backend="eager")
    x = torch.ones(1)
    for _ in range(100):
        compiled(x)
    before = live_user_objects()
    for _ in range(10_000):
        compiled(x)
    after = live_user_objects()
    assert after - before <= 2, (before, after)


@pytest.mark.usefixtures("installed")
def test_a_stream_passed_to_every_call_keeps_a_bounded_log() -> None:
    """The objects a CPU training loop makes once and passes to each step are synced on
    every step: their logs keep the latest syncs, not the whole run's."""

    def step(
        x: torch.Tensor, side: torch.Stream, main: torch.Stream, done: torch.Event
    ) -> torch.Tensor:
        side.wait_stream(main)
        with side:
            y = x + 1
        done.record(side)
        done.wait(main)
        return y

    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    side, main, done = SimStream(device="cpu"), SimStream(device="cpu"), SimEvent(device="cpu")
    for _ in range(3 * simulator.LOG_LIMIT):
        compiled(torch.ones(1), side, main, done)
    assert simulator.LOG_LIMIT // 2 <= len(done.log) <= simulator.LOG_LIMIT
    recorded, waited = done.log[-2:]
    assert recorded == ("record", side), "the latest syncs are kept"
    # (torch 2.11 issues the wait as ``main.wait_event(done)``)
    assert waited in (("wait", main), ("waited_by", main)), "the latest syncs are kept"
    assert simulator.LOG_LIMIT // 2 <= len(side.log) <= simulator.LOG_LIMIT


@pytest.mark.usefixtures("installed")
def test_threads_each_see_their_own_objects() -> None:
    mismatches: list[tuple[object, object, object]] = []
    streams = [SimStream(device="cpu") for _ in range(8)]

    def check_twice(index: int, expected_tag: torch.Tensor) -> None:
        first = torch_userstreams.lookup(index)
        time.sleep(0.0002)
        second = torch_userstreams.lookup(index)
        want = streams[int(expected_tag.item())]
        if not (first is second is want):
            mismatches.append((first, second, want))  # list.append is atomic

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        (index,) = stream_input_indices(gm)
        graph = gm.graph
        tag, output = node_of(graph, "placeholder"), node_of(graph, "output")
        with graph.inserting_before(output):
            graph.call_function(check_twice, (index, tag))
        gm.recompile()
        return gm

    def first(tag: torch.Tensor, s: torch.Stream) -> torch.Tensor:
        with s:
            return tag + 1

    def second(tag: torch.Tensor, s: torch.Stream) -> torch.Tensor:
        with s:
            return tag * 3

    compiled = [torch.compile(first, backend=backend), torch.compile(second, backend=backend)]
    for fn in compiled:  # compile once, before the race
        fn(torch.tensor(0.0), streams[0])

    def worker(tid: int) -> None:
        for i in range(300):
            slot = 2 * tid + (i % 2)
            compiled[i % 2](torch.tensor(float(slot)), streams[slot])

    run_threads(worker, 4)
    assert mismatches == []


@pytest.mark.usefixtures("installed")
def test_nested_compiled_call_does_not_clobber_the_outer_binding() -> None:
    inner_stream = SimStream(device="cpu")

    def inner(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
        with s:
            return x + 1

    compiled_inner = torch.compile(inner, backend=probe_inputs)

    def call_inner(x: torch.Tensor) -> torch.Tensor:
        return compiled_inner(x, inner_stream)

    def outer_backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        indices = stream_input_indices(gm)
        insert_probe(gm, indices)  # before the nested call
        graph = gm.graph
        output, x = node_of(graph, "output"), node_of(graph, "placeholder")
        with graph.inserting_before(output):
            graph.call_function(call_inner, (x,))
            lookups = [graph.call_function(torch_userstreams.lookup, (i,)) for i in indices]
            graph.call_function(probe, tuple(lookups))
        gm.recompile()
        return gm

    def outer(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
        with s:
            return x * 2

    outer_stream = SimStream(device="cpu")
    seen().clear()
    torch.compile(outer, backend=outer_backend)(torch.ones(1), outer_stream)
    calls = [call[0] for call in seen()]
    expected = [outer_stream, inner_stream, outer_stream]
    assert all(a is b for a, b in zip(calls, expected, strict=True))


@pytest.mark.usefixtures("installed")
def test_graph_break_gives_each_graph_its_own_table() -> None:
    def broken(x: torch.Tensor, a: torch.Stream, b: torch.Stream) -> torch.Tensor:
        with a:
            y = x + 1
        torch._dynamo.graph_break()
        with b:
            return y * 2

    stream_a, stream_b = SimStream(device="cpu"), SimStream(device="cpu")
    report = torch_userstreams.explain(broken, torch.ones(1), stream_a, stream_b)
    assert torch.equal(report.result, torch.full((1,), 4.0))
    assert [[e.origin for e in t.entries] for t in report.tables] == [["L['a']"], ["L['b']"]]
    assert [t.entries[0].index for t in report.tables] == [0, 0]


@pytest.mark.usefixtures("installed")
def test_recompile_after_guard_failure_builds_a_new_table() -> None:
    def f(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
        with s:
            return x + 1

    seen().clear()
    compiled = torch.compile(f, backend=probe_inputs, dynamic=False)
    s = SimStream(device="cpu")
    compiled(torch.ones(1), s)
    compiled(torch.ones(3, dtype=torch.float64), s)  # dtype change: recompile
    compiled(torch.ones(1), s)
    assert [call[0] for call in seen()] == [s, s, s]


def test_graph_compiled_before_install_keeps_native_behaviour() -> None:
    def f(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
        with s:
            return x + 1

    native_compiled = torch.compile(f, backend=probe_inputs)
    s = torch.Stream(device="cpu")
    seen().clear()
    native_compiled(torch.ones(1), s)
    with torch_userstreams.installed():
        native_compiled(torch.ones(1), s)
    native_compiled(torch.ones(1), s)
    assert [call[0] is s for call in seen()] == [True, True, True]


def test_graph_compiled_while_installed_runs_after_uninstall() -> None:
    with torch_userstreams.installed():
        compiled = torch.compile(stream_and_event, backend="eager")
        compiled(torch.ones(1))
    y, side, done = compiled(torch.ones(1))
    assert torch.equal(y, torch.full((1,), 3.0))
    assert done.log == [("record", side)]


def test_install_compile_uninstall_native_again_in_one_process() -> None:
    def f(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
        with s:
            return x + 1

    s = torch.Stream(device="cpu")
    from torch._dynamo import graph_bytecode_inputs as native

    torch.compile(f, backend="eager")(torch.ones(1), s)
    assert native.index_to_bytecode_constructor, "native registers into its global table"
    torch._dynamo.reset()
    with torch_userstreams.installed():
        report = torch_userstreams.explain(f, torch.ones(1), s)
        assert [e.origin for e in report.tables[0].entries] == ["L['s']"]
        assert not native.index_to_bytecode_constructor, "the package leaves native's alone"
    torch._dynamo.reset()
    torch.compile(f, backend="eager")(torch.ones(1), s)
    assert native.index_to_bytecode_constructor, "native again after uninstall"


@pytest.mark.usefixtures("installed")
def test_strict_export_of_a_function_that_creates_an_event() -> None:
    class Model(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            done = torch.Event(device="cpu")
            done.wait(torch.Stream(device="cpu"))  # native CPU events can wait, not record
            return x + 1

    exported = torch.export.export(Model(), (torch.ones(2),), strict=True)
    assert torch.equal(exported.module()(torch.ones(2)), torch.full((2,), 2.0))


@pytest.mark.usefixtures("installed")
def test_stream_free_graph_gets_no_prologue() -> None:
    report = torch_userstreams.explain(lambda x: x + 1, torch.ones(1))
    assert report.tables == []
    assert str(report) == "1 graph(s), 0 graph break(s)\nno graph with user objects was compiled"
