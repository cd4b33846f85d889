"""Generated stream programs: compiled equals eager, every graph is hazard-free, no leaks.

Programs come from ``torch_userstreams.testing.strategies.programs`` (race-free as written).
For each one, through the ``userstreams_aot_eager`` backend:

* outputs and gradients equal the eager run (Sim objects standing in for CPU streams);
* ``check_stream_safety`` finds nothing in any captured forward or backward graph;
* repeated calls (with backward) do not grow the number of live streams and events.

No program is excused: issues the generator found have their smallest reproducer below.

Profiles (env ``HYPOTHESIS_PROFILE``): ``ci`` (default; 2 x 130 derandomized examples plus
65 for the leak property: 325 programs, a few minutes on 2 cores) and ``long``
(2 x 2500 + 1250, random). ``--hypothesis-show-statistics`` shows what the programs were.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
import torch.fx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from torch_userstreams.compile.table import Phase
from torch_userstreams.simulator import SimStream
from torch_userstreams.testing import (
    Capture,
    assert_stream_safe,
    capture,
    check_stream_safety,
)
from torch_userstreams.testing.graph_view import Sync, read_graph
from torch_userstreams.testing.objects import live_user_objects
from torch_userstreams.testing.programs import Program, leaves
from torch_userstreams.testing.strategies import programs

_COMMON = {
    "deadline": None,
    "suppress_health_check": [
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
}
settings.register_profile("ci", max_examples=130, derandomize=True, database=None, **_COMMON)
settings.register_profile("long", max_examples=2500, **_COMMON)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
TORCH = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
CALLS_FOR_LEAK_CHECK = 3
LEAK_SHARE = 2  # the leak property runs half the profile's examples
INDUCTOR_SHARE = 10  # and the property with Inductor a tenth


def run_eager(program: Program, streams: list[SimStream]) -> tuple[Any, list[Any]]:
    x, w = leaves()
    out = program.build(eager=True)(x, w, *streams)
    backward(out)
    return out, [x.grad, w.grad]


def backward(out: tuple[torch.Tensor, ...]) -> None:
    tensors = [t for t in out if t.requires_grad]
    if tensors:
        sum(t.sum() for t in tensors).backward()  # type: ignore[union-attr]


def run_compiled(
    program: Program, streams: list[SimStream], backend: str = "userstreams_aot_eager"
) -> tuple[Capture, list[Any]]:
    x, w = leaves()
    captured = capture(program.build(eager=False), x, w, *streams, backend=backend)
    return captured, [x.grad, w.grad]


def assert_close(eager: Any, compiled: Any) -> None:
    for a, b in zip(eager, compiled, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a)


def assert_graphs_safe(program: Program, captured: Capture) -> None:
    for label, gm in captured.graphs:
        result = check_stream_safety(gm)
        assert result, f"{label}:\n{result}\n{gm.graph}\nprogram:\n{program}"


def assert_no_leak(captured: Capture, streams: list[SimStream]) -> None:
    """Input Sim streams log every sync, with the per-call objects it names: cleared here."""
    compiled = captured.compiled
    assert compiled is not None

    def calls() -> None:
        for _ in range(CALLS_FOR_LEAK_CHECK):
            x, w = leaves()
            backward(compiled(x, w, *streams))
        for stream in streams:
            stream.log.clear()

    calls()
    before = live_user_objects()
    calls()
    assert live_user_objects() <= before


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("graph_breaks", [False, True], ids=["one-graph", "graph-breaks"])
@PROFILE
@given(data=st.data())
def test_generated_program(graph_breaks: bool, data: st.DataObject) -> None:
    """Compiled equals eager, and every captured graph is hazard-free."""
    program = data.draw(programs(graph_breaks=graph_breaks), label="program")
    streams = program.stream_inputs()
    eager_out, eager_grads = run_eager(program, streams)
    captured, grads = run_compiled(program, streams)
    event(f"graphs: {len(captured.forward)} forward, {len(captured.backward)} backward")
    assert_close(eager_out, captured.result)
    assert_close(eager_grads, grads)
    assert_graphs_safe(program, captured)


@pytest.mark.usefixtures("installed")
@settings(PROFILE, max_examples=max(1, PROFILE.max_examples // INDUCTOR_SHARE))
@given(program=programs(graph_breaks=False))
def test_generated_program_with_inductor(program: Program) -> None:
    """The same with ``userstreams``: the checker reads the forward and backward graphs
    that Inductor's partitioner (min-cut, with its CSE) made, before they are cut into
    regions (on CPU they are not cut: one Inductor graph each). Fewer examples, since
    Inductor compiles each; the ci profile's 13 did not find the cross-stream CSE merge
    (``patch.cse``) with that fix reverted, the long profile did (in about 6 minutes)."""
    streams = program.stream_inputs()
    eager_out, eager_grads = run_eager(program, streams)
    captured, grads = run_compiled(program, streams, backend="userstreams")
    assert_close(eager_out, captured.result)
    assert_close(eager_grads, grads)
    assert_graphs_safe(program, captured)


@pytest.mark.usefixtures("installed")
@settings(PROFILE, max_examples=max(1, PROFILE.max_examples // LEAK_SHARE))
@given(program=programs())
def test_generated_program_does_not_leak(program: Program) -> None:
    """Live streams/events stay flat over repeated calls (fewer examples: counting is slow)."""
    streams = program.stream_inputs()
    captured, _ = run_compiled(program, streams)
    assert_no_leak(captured, streams)


# -- issues found by the generator, each with its smallest reproducer ---------------------


def saved_control_deps(
    x: torch.Tensor, w: torch.Tensor, s1: torch.Stream, s2: torch.Stream
) -> tuple[torch.Tensor]:
    with s1:
        v2 = w * 0.5
    e4 = torch.Event(device="cpu")
    e4.record(s1)
    e4.wait(s2)
    with s2:
        v2.sin()  # an unused result on s2, after the wait
    v7 = w.tanh()
    s2.synchronize()
    return (v7,)


@pytest.mark.usefixtures("installed")
def test_sync_after_unused_side_stream_result_compiles() -> None:
    x, w = leaves()
    compiled = torch.compile(saved_control_deps, backend="userstreams_aot_eager")
    out = compiled(x, w, SimStream(device="cpu"), SimStream(device="cpu"))
    backward(out)


def forward_sync_saved(
    x: torch.Tensor, w: torch.Tensor, s2: torch.Stream
) -> tuple[torch.Tensor, ...]:
    """A forward sync copied into the backward graph saved its control_deps (no tensor)."""
    s0 = torch.Stream(device="cpu")
    with s0:
        v2 = w.sin()
        v3 = x.sin()
    e4 = torch.Event(device="cpu")
    e4.record(s0)
    s2.wait_event(e4)
    v5 = v3.tanh()
    v7 = x.cos()
    v2.mul_(2.0)
    return v5, v7.sin(), w + x, w * 0.5


@pytest.mark.usefixtures("installed")
def test_forward_syncs_stay_in_the_forward_graph() -> None:
    x, w = leaves()
    captured = capture(forward_sync_saved, x, w, SimStream(device="cpu"))
    (table,) = captured.tables
    (backward_graph,) = captured.backward
    syncs = [s for s in read_graph(backward_graph, {}).steps if isinstance(s, Sync)]
    events = [s.args[0] for s in syncs if s.name in ("record_event", "wait_event")]
    assert events, backward_graph.graph
    forward_events = [i for i in events if table.entries[i].phase is not Phase.BACKWARD]
    assert forward_events == [], f"forward syncs in the backward graph:\n{backward_graph.graph}"


def frees_early(x: torch.Tensor, w: torch.Tensor, s1: torch.Stream) -> tuple[torch.Tensor, ...]:
    s2 = torch.Stream(device="cpu")
    with s1:
        a = x * 0.5
    done = torch.Event(device="cpu")
    done.record(s1)
    done.wait(s2)
    with s2:
        b = a + w  # last use of a: compiled code frees it here
    with s1:
        c = w * 0.5  # s1 may take a's memory while b still reads it
    joined = torch.Event(device="cpu")
    joined.record(s2)
    joined.wait(s1)  # eager frees a only after this, at the return
    return b, c


def test_forward_keeps_cross_stream_values_until_their_stream_waits() -> None:
    x, w = leaves()
    (forward,) = capture(frees_early, x, w, SimStream(device="cpu")).forward
    assert_stream_safe(forward)


def used_across_then_at_home(
    x: torch.Tensor, w: torch.Tensor, s0: torch.Stream, s1: torch.Stream
) -> tuple[torch.Tensor, torch.Tensor]:
    """Backward: grad of ``a`` is made on s1, read on s0 (x's grad), last read on s1."""
    with s1:
        a = w.cos()
    ready = torch.Event(device="cpu")
    ready.record(s1)
    ready.wait(s0)
    with s0:
        a.add_(x)
        b = x.cos()
    done = torch.Event(device="cpu")
    done.record(s0)
    done.wait(s1)
    with s1:
        c = a.cos()
    return b, c


def test_backward_tensor_used_on_another_stream_before_its_last_use() -> None:
    x, w = leaves()
    streams = (SimStream(device="cpu"), SimStream(device="cpu"))
    captured = capture(used_across_then_at_home, x, w, *streams)
    (forward,) = captured.forward
    assert_stream_safe(forward)
    (backward_graph,) = captured.backward
    assert_stream_safe(backward_graph)


def used_on_two_other_streams(
    x: torch.Tensor, w: torch.Tensor, s0: torch.Stream, s1: torch.Stream, s2: torch.Stream
) -> tuple[torch.Tensor, ...]:
    """Backward: grad of ``c`` is made on s2 and read on s1 (``b``'s backward) and on s0."""
    with s0:
        a = x.cos()
        with s1:
            b = x - x
            with s2:
                ready = torch.Event(device="cpu")
                ready.record(s1)
                ready.wait(s2)
                c = b.cos()
        d = x.cos()
    done = torch.Event(device="cpu")
    done.record(s2)
    done.wait(s1)
    return a, c, d


def test_backward_tensor_used_on_two_other_streams() -> None:
    x, w = leaves()
    streams = [SimStream(device="cpu") for _ in range(3)]
    captured = capture(used_on_two_other_streams, x, w, *streams)
    (forward,) = captured.forward
    assert_stream_safe(forward)
    (backward_graph,) = captured.backward
    assert_stream_safe(backward_graph)


def recomputable_across_streams(
    x: torch.Tensor, w: torch.Tensor, s1: torch.Stream, s2: torch.Stream
) -> torch.Tensor:
    """``v = x.cos()`` on s1, then ``v.add_(x)`` on s2 after a wait: two cheap ops of x, so
    the min-cut partitioner (torch 2.11, no ``control_deps``) computed both again in the
    backward for ``v * w``'s gradient, with no sync between them there."""
    with s1:
        v = x.cos()
    ready = torch.Event(device="cpu")
    ready.record(s1)
    ready.wait(s2)
    with s2:
        v.add_(x)
        return v * w


def recomputable_through_a_view(
    x: torch.Tensor, w: torch.Tensor, s1: torch.Stream, s2: torch.Stream
) -> torch.Tensor:
    """The same read across streams through a view: the partitioner recomputes views
    whatever their tag, so the op to save is the view's first reader (found by review)."""
    with s1:
        v = x.cos()
    ready = torch.Event(device="cpu")
    ready.record(s1)
    ready.wait(s2)
    with s2:
        return (v.view(-1, 1) + x.view(-1, 1)) * w.view(-1, 1)


@pytest.mark.parametrize("program", [recomputable_across_streams, recomputable_through_a_view])
def test_backward_does_not_recompute_a_read_across_streams(program: Any) -> None:
    x, w = leaves()
    streams = (SimStream(device="cpu"), SimStream(device="cpu"))
    captured = capture(program, x, w, *streams, backend="userstreams")
    (backward_graph,) = captured.backward
    assert_stream_safe(backward_graph)


def read_by_the_backward_through_an_alias(
    x: torch.Tensor, w: torch.Tensor, s1: torch.Stream, s2: torch.Stream
) -> torch.Tensor:
    """``t = tanh(x * w)`` on s1, read on s2 after a wait; tanh's gradient reads ``t``,
    which AOTAutograd 2.11 hands the backward through an ``alias``. Counted as a tensor that
    dies in the forward, it was not saved: 2.11's partitioner computed ``tanh`` again in the
    backward (a kernel there, and a dealloc sync in the forward; the demo's step)."""
    with s1:
        t = (x * w).tanh()
    ready = torch.Event(device="cpu")
    ready.record(s1)
    ready.wait(s2)
    with s2:
        return (t + x).relu()


def test_a_value_the_backward_reads_through_an_alias_is_not_computed_again() -> None:
    x, w = leaves()
    streams = (SimStream(device="cpu"), SimStream(device="cpu"))
    captured = capture(read_by_the_backward_through_an_alias, x, w, *streams, backend="userstreams")
    (backward_graph,) = captured.backward
    assert_stream_safe(backward_graph)
    tanh = torch.ops.aten.tanh.default
    assert not [n for n in backward_graph.graph.nodes if n.target is tanh], backward_graph.code
