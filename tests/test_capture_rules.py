"""CUDA's stream-capture rules, checked when a graph compiles under reduce-overhead (issue
40, point 2): ``backends.capture_rules`` on small hand-made graphs (one test per rule), on
generated fork/join programs and their mutations (Hypothesis), and the skip and error
messages of ``backend="userstreams", mode="reduce-overhead"``. A graph without streams
compiles exactly as with Inductor."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.fx
from helpers import Messages
from hypothesis import HealthCheck, given, settings

import torch_userstreams
from torch_userstreams.backends.capture_rules import Rule, Violation, capture_violations
from torch_userstreams.compile.table import EntryKind, Reader, UserObjectTable
from torch_userstreams.fx.meta import host_tensors_as, set_stream
from torch_userstreams.run.own_ops import sync_op
from torch_userstreams.testing import programs, strategies
from torch_userstreams.testing.capture import capture, no_compile_caches
from torch_userstreams.testing.fake_accelerator import (
    DEVICE,
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)

CURRENT, SIDE, OTHER, DONE, MADE, PASS_MADE = 0, 1, 2, 3, 4, 5  # the indices of ``table()``


def table() -> UserObjectTable:
    """The current stream, two input streams, an input event, an event the graph makes."""
    made = UserObjectTable("f [0/0]")

    def emit(codegen: Any) -> None:
        raise AssertionError("not emitted in these tests")

    made.add_current_stream(DEVICE, emit, FakeAcceleratorStream(), added_by="dynamo")
    for origin in ("L['side']", "L['other']"):
        made.add(EntryKind.INPUT, origin, emit, FakeAcceleratorStream(), added_by="dynamo")
    made.add(EntryKind.INPUT, "L['done']", emit, FakeAcceleratorEvent(), added_by="dynamo")
    made.add(
        EntryKind.GRAPH_CREATED, "torch.Event()", emit, FakeAcceleratorEvent(), added_by="dynamo"
    )
    made.add(EntryKind.REQUESTED, "torch.Event()", emit, FakeAcceleratorEvent(), added_by="a pass")
    return made


class Graph:
    """A graph written step by step: ``op`` a kernel, ``sync`` a ``streams::*`` op."""

    def __init__(self) -> None:
        self.graph = torch.fx.Graph()
        self.last = self.graph.placeholder("x")
        self.last.meta["val"] = torch.randn(4)

    def op(self, stream: int | None = None, line: int | None = None) -> torch.fx.Node:
        node = self.graph.call_function(torch.ops.aten.sin.default, (self.last,))
        node.meta["val"] = torch.randn(4)
        if stream is not None:
            set_stream(node, stream)
        if line is not None:
            node.meta["stack_trace"] = (
                f'  File "prog.py", line {line}, in f\n    y = x.sin()\n        ^^^^^^^\n'
            )
        self.last = node
        return node

    def sync(self, name: str, *args: int) -> torch.fx.Node:
        try:  # the package's own op where torch lacks it (2.11's synchronize_*)
            op = sync_op(name)
        except KeyError:
            pytest.skip(f"torch {torch.__version__} has no streams::{name}: no graph has it")
        return self.graph.call_function(op, args)

    def check(self, objects: UserObjectTable | None = None) -> list[Violation]:
        """The violations, against ``objects`` (``table()`` unless given)."""
        self.graph.output((self.last,))
        gm = torch.fx.GraphModule(torch.nn.Module(), self.graph)
        with host_tensors_as(DEVICE):  # the CPU tensors count as the accelerator's
            return capture_violations(gm, objects or table())


def rules(found: list[Violation]) -> list[tuple[Rule, str]]:
    return [(v.rule, v.subject) for v in found]


# -- one rule at a time ----------------------------------------------------------------


def test_a_side_stream_forked_and_joined_follows_the_rules() -> None:
    g = Graph()
    g.op()
    g.sync("wait_stream", SIDE, CURRENT)
    g.op(SIDE)
    g.sync("wait_stream", CURRENT, SIDE)
    g.op()
    assert g.check() == []


def test_side_work_that_waits_for_nothing_is_not_forked_and_named_with_its_line() -> None:
    g = Graph()
    work = g.op(SIDE, line=7)
    g.sync("wait_stream", CURRENT, SIDE)
    [found] = g.check()
    assert (found.rule, found.subject, found.node) == (
        Rule.NOT_FORKED,
        "stream L['side']",
        work.name,
    )
    assert found.line == "prog.py:7 in f: y = x.sin()"
    assert "wait_stream(torch.cuda.current_stream())" in found.fix
    assert "L['side']" in str(found) and "prog.py:7" in str(found)


def test_a_fork_counts_through_another_forked_stream_only() -> None:
    through_forked = Graph()
    through_forked.sync("wait_stream", OTHER, CURRENT)
    through_forked.sync("record_event", MADE, OTHER)
    through_forked.sync("wait_event", MADE, SIDE)
    through_forked.op(SIDE)
    through_forked.sync("wait_stream", CURRENT, SIDE)
    through_forked.sync("wait_stream", CURRENT, OTHER)
    assert through_forked.check() == []

    through_unforked = Graph()
    through_unforked.sync("wait_stream", SIDE, OTHER)  # other is not capturing
    through_unforked.op(SIDE)
    through_unforked.sync("wait_stream", CURRENT, SIDE)
    assert rules(through_unforked.check()) == [(Rule.NOT_FORKED, "stream L['side']")]


def test_waiting_on_an_event_recorded_on_an_unforked_stream_names_that_stream() -> None:
    g = Graph()
    record = g.sync("record_event", MADE, OTHER)
    g.sync("wait_event", MADE, CURRENT)
    [found] = g.check()
    assert (found.rule, found.subject, found.node) == (
        Rule.NOT_FORKED,
        "stream L['other']",
        record.name,
    )


def test_side_work_the_current_stream_does_not_wait_for_is_not_joined() -> None:
    g = Graph()
    g.sync("wait_stream", SIDE, CURRENT)
    g.op(SIDE)
    g.sync("wait_stream", CURRENT, SIDE)
    late = g.op(SIDE, line=9)  # after the join
    [found] = g.check()
    assert (found.rule, found.subject, found.node) == (
        Rule.NOT_JOINED,
        "stream L['side']",
        late.name,
    )
    assert "unjoined work" in found.problem
    assert "torch.cuda.current_stream().wait_stream(stream)" in found.fix


def test_a_forked_stream_with_no_work_must_still_be_joined() -> None:
    g = Graph()
    fork = g.sync("wait_stream", SIDE, CURRENT)
    g.op()
    assert [(v.rule, v.node) for v in g.check()] == [(Rule.NOT_JOINED, fork.name)]


@pytest.mark.parametrize(
    ("name", "args", "subject"),
    [
        ("synchronize_stream", (SIDE,), "synchronize_stream(L['side'])"),
        ("synchronize_event", (MADE,), "synchronize_event(torch.Event())"),
        ("synchronize_device", (0,), "synchronize_device()"),
    ],
)
def test_a_host_sync_inside_breaks_the_capture(name: str, args: tuple, subject: str) -> None:
    g = Graph()
    g.sync("wait_stream", SIDE, CURRENT)
    g.sync("record_event", MADE, SIDE)
    g.sync(name, *args)
    g.sync("wait_event", MADE, CURRENT)
    assert rules(g.check()) == [(Rule.HOST_SYNC, subject)]


def test_a_synchronize_does_not_fork_a_stream() -> None:
    g = Graph()
    g.op()
    g.sync("synchronize_stream", CURRENT)
    g.op(SIDE)
    g.sync("wait_stream", CURRENT, SIDE)
    assert [v.rule for v in g.check()] == [Rule.HOST_SYNC, Rule.NOT_FORKED]


def test_an_outside_event_recorded_and_not_waited_inside_crosses_the_boundary() -> None:
    g = Graph()
    g.op()
    record = g.sync("record_event", DONE, CURRENT)
    [found] = g.check()
    assert (found.rule, found.subject, found.node) == (
        Rule.OUTSIDE_EVENT,
        "event L['done']",
        record.name,
    )
    assert "not waited on inside" in found.problem


def test_an_event_recorded_and_waited_inside_or_made_by_the_graph_stays_inside() -> None:
    waited = Graph()
    waited.sync("record_event", DONE, CURRENT)
    waited.sync("wait_event", DONE, CURRENT)
    assert waited.check() == []
    made = Graph()
    made.sync("record_event", MADE, CURRENT)  # fresh each call: nothing outside has it
    assert made.check() == []


def test_an_event_a_pass_made_stays_inside_unless_the_backend_reads_it() -> None:
    """A requested event is made fresh each call; one its requester reads outside the graph
    (``Reader.CODE``) is held outside, like an input."""
    g = Graph()
    g.sync("record_event", PASS_MADE, CURRENT)
    assert g.check() == []
    read = Graph()
    read.sync("record_event", PASS_MADE, CURRENT)
    with_reader = table()
    with_reader.entries[PASS_MADE].reader = Reader.CODE
    assert [v.rule for v in read.check(with_reader)] == [Rule.OUTSIDE_EVENT]


def test_a_wait_on_an_event_the_graph_does_not_record_crosses_the_boundary() -> None:
    g = Graph()
    wait = g.sync("wait_event", DONE, CURRENT)
    g.sync("record_event", DONE, CURRENT)  # a record after the wait does not count
    g.sync("wait_event", DONE, CURRENT)
    [found] = g.check()
    assert (found.rule, found.subject, found.node) == (
        Rule.OUTSIDE_EVENT,
        "event L['done']",
        wait.name,
    )
    assert "recorded outside" in found.problem


# -- generated fork/join programs, and mutations that break one rule ---------------------

FORMS = ("event", "wait_event", "wait_stream", "record_in_with")  # no synchronize
CUDA_CURRENT = "torch.cuda.current_stream()"  # traced as the current-stream entry


def render(program: programs.Program, mutation: str | None) -> str:
    """The program framed by fork and join on the fake accelerator, mutated. Every stream
    is an input (a local accelerator stream cannot be made on a CPU-only build)."""
    body = list(program.body)
    at = len(body) // 2
    if mutation in ("record", "wait", "synchronize"):
        form, args = {
            "record": ("record", ("done", "s0")),
            "wait": ("wait", ("done", "s0")),
            "synchronize": ("synchronize_stream", ("s0",)),
        }[mutation]
        body.insert(at, programs.UserSync(form, args))
    program = dataclasses.replace(
        program, input_streams=program.streams, local_streams=(), body=tuple(body)
    )
    source = program.source(eager=False, device="cpu", frame=True)
    source = source.replace("torch.accelerator.current_stream(DEVICE)", CUDA_CURRENT)
    source = source.replace("def program(", "def program(done, ")
    lines = source.splitlines()
    if mutation == "no fork":
        lines = [line for line in lines if "forked.wait(" not in line]
    if mutation == "no join":
        lines = [line for line in lines if f".wait({CUDA_CURRENT})" not in line]
    return "\n".join(lines) + "\n"


def violations_of(program: programs.Program, mutation: str | None) -> list[Violation]:
    """The violations of the program's (inference) graph, as compiled on the accelerator."""
    fn = programs.build_source(render(program, mutation), eager=False)
    x, w = (leaf.detach() for leaf in programs.leaves())
    streams = [FakeAcceleratorStream() for _ in program.streams]
    with fake_accelerator(gpu_semantics=True):
        captured = capture(fn, FakeAcceleratorEvent(), x, w, *streams)
        [gm], [graph_table] = captured.forward, captured.tables
        return capture_violations(gm, graph_table)


def by_parameter_name(subject: str, program: programs.Program) -> str:
    """Dynamo 2.12 names an argument of the built program by its position
    (``L['args'][3]``), other releases by its name (``L['s0']``): the name, for both."""
    parameters = ["done", "x", "w", *program.streams]
    return re.sub(r"L\['args'\]\[(\d+)\]", lambda m: f"L['{parameters[int(m[1])]}']", subject)


STREAM_PROGRAMS = strategies.programs(graph_breaks=False, sync_forms=FORMS, max_ops=5)
EXPECTED: dict[str | None, Callable[[programs.Program], set[tuple[Rule, str]]]] = {
    None: lambda p: set(),
    # The join records an event on every stream for the current stream to wait on.
    "no fork": lambda p: {(Rule.NOT_FORKED, f"stream L['{s}']") for s in p.streams},
    "no join": lambda p: {(Rule.NOT_JOINED, f"stream L['{s}']") for s in p.streams},
    "synchronize": lambda p: {(Rule.HOST_SYNC, "synchronize_stream(L['s0'])")},
    "record": lambda p: {(Rule.OUTSIDE_EVENT, "event L['done']")},
    "wait": lambda p: {(Rule.OUTSIDE_EVENT, "event L['done']")},
}


@pytest.mark.parametrize("mutation", list(EXPECTED), ids=lambda m: m or "fork then join")
@settings(
    max_examples=12,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(program=STREAM_PROGRAMS)
def test_fork_join_programs_pass_and_each_mutation_breaks_its_rule(
    program: programs.Program, mutation: str | None
) -> None:
    torch_userstreams.install()
    found = violations_of(program, mutation)
    shown = render(program, mutation) + "\n".join(map(str, found))
    subjects = {(v.rule, by_parameter_name(v.subject, program)) for v in found}
    assert subjects == EXPECTED[mutation](program), shown
    assert len(found) == len(EXPECTED[mutation](program)), found  # each reported once


# -- what reduce-overhead says ---------------------------------------------------------


def forked_and_joined(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    side.wait_stream(torch.cuda.current_stream())
    with side:
        y = x.sin() * 2
    torch.cuda.current_stream().wait_stream(side)
    return y


def not_forked(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    with side:
        y = x.sin() * 2
    torch.cuda.current_stream().wait_stream(side)
    return y


def plain(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2


@pytest.fixture
def cudagraph_log() -> Iterator[Messages]:
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_utils import cudagraphs_log

    counters.clear()
    handler = Messages()
    cudagraphs_log.addHandler(handler)
    try:
        yield handler
    finally:
        cudagraphs_log.removeHandler(handler)


def reduce_overhead(fn: Callable[..., Any], *args: Any, or_error: bool = False) -> Any:
    """``fn`` compiled with CUDA graphs asked for, run once on the fake accelerator."""
    torch_userstreams.install()
    options: dict[str, Any] = {"triton.cudagraphs": True, "triton.cudagraph_or_error": or_error}
    compiled = torch.compile(fn, backend="userstreams", options=options)
    with fake_accelerator(gpu_semantics=True), no_compile_caches():
        return compiled(*args)


def test_the_skip_says_a_graph_that_follows_the_rules_is_skipped_for_its_compile_path(
    cudagraph_log: Messages,
) -> None:
    """One call per graph: not captured yet."""
    x = torch.randn(4)
    torch.testing.assert_close(
        reduce_overhead(forked_and_joined, x, FakeAcceleratorStream()), 2 * x.sin()
    )
    [skip] = [m for m in cudagraph_log.messages if "torch_userstreams" in m]
    assert skip.startswith(
        "skipping cudagraphs due to torch_userstreams: graph forked_and_joined"
    ), skip
    assert "follows CUDA's stream-capture rules" in skip
    path = "captures no graph with streams as CUDA graphs yet"
    assert f"skipped only because backend 'userstreams' {path}" in skip, skip


def test_the_skip_lists_each_broken_rule_with_the_stream_line_and_fix(
    cudagraph_log: Messages,
) -> None:
    x = torch.randn(4)
    torch.testing.assert_close(reduce_overhead(not_forked, x, FakeAcceleratorStream()), 2 * x.sin())
    [skip] = [m for m in cudagraph_log.messages if "torch_userstreams" in m]
    assert "graph not_forked" in skip and "(forward) breaks 1 CUDA stream-capture rule" in skip
    assert "[a: side stream not forked from the capture] stream L['side']" in skip
    assert "test_capture_rules.py" in skip and "y = x.sin() * 2" in skip, skip
    assert "fix: make it wait for the current stream" in skip
    assert "The graph runs without CUDA graphs." in skip


def test_a_failing_check_words_the_skip_without_failing_the_compile(
    cudagraph_log: Messages, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check only words the skip: a bug in it (or a graph it cannot read) must leave the
    compile as it was, with the plain skip."""
    from torch_userstreams.backends import capture_rules

    def broken(gm: Any, table: Any) -> list[Violation]:
        raise RuntimeError("a graph the check cannot read")

    monkeypatch.setattr(capture_rules, "capture_violations", broken)
    x = torch.randn(4)
    torch.testing.assert_close(reduce_overhead(not_forked, x, FakeAcceleratorStream()), 2 * x.sin())
    [skip] = [m for m in cudagraph_log.messages if "torch_userstreams" in m]
    assert "graph not_forked" in skip and "(forward) uses streams, and backend" in skip, skip
    assert "capture rule" not in skip


def test_cudagraph_or_error_raises_with_the_broken_rules() -> None:
    with pytest.raises(Exception, match=r"stream L\['side'\]") as raised:
        reduce_overhead(not_forked, torch.randn(4), FakeAcceleratorStream(), or_error=True)
    assert "torch_userstreams: graph not_forked" in str(raised.value)
    assert "side stream not forked" in str(raised.value)


def test_a_graph_without_streams_is_skipped_exactly_as_by_inductor(
    cudagraph_log: Messages,
) -> None:
    """No package line, the same skips (on CPU Inductor skips CUDA graphs itself)."""
    from torch._dynamo.utils import counters

    torch_userstreams.install()
    x = torch.randn(4)
    runs: dict[str, tuple[int, list[str]]] = {}
    for backend in ("inductor", "userstreams"):
        torch._dynamo.reset()
        counters.clear()
        cudagraph_log.messages.clear()
        compiled = torch.compile(plain, backend=backend, mode="reduce-overhead")
        with no_compile_caches():
            torch.testing.assert_close(compiled(x), 2 * x.sin())
        runs[backend] = (counters["inductor"]["cudagraph_skips"], list(cudagraph_log.messages))
    assert runs["inductor"][0] >= 1, runs  # Inductor itself skips CPU graphs
    assert runs["userstreams"] == runs["inductor"]
    assert not any("torch_userstreams" in m for m in runs["userstreams"][1])
