"""``inductor.regions.split`` on hand-built graphs: which nodes share a region.

A node with side effects (a mutation, a runtime check) never runs earlier than what precedes
it. It used to open a region of its own every time, so a data-dependent size's checks
(``_assert_scalar`` of ``u0 >= 0``) landed in another region than the size, and on torch
2.11 the check's SymBool became a region input, which Inductor refuses.
"""

from __future__ import annotations

import torch
import torch.fx

from torch_userstreams.fx.meta import record, records, set_stream
from torch_userstreams.inductor.regions import Region, copy_factories_per_stream, split

ops = torch.ops.aten
SIDE, MAIN = 0, None


def node(
    graph: torch.fx.Graph,
    target: object,
    args: tuple,  # type: ignore[type-arg]
    stream: int | None,
) -> torch.fx.Node:
    made = graph.call_function(target, args)  # type: ignore[arg-type]
    if stream is not None:
        set_stream(made, stream)
    return made


def op(node: torch.fx.Node) -> str:
    return node.target.__name__.split(".")[0]  # type: ignore[union-attr]


def regions(graph: torch.fx.Graph) -> list[tuple[int | None, list[str]]]:
    steps = split(torch.fx.GraphModule(torch.nn.Module(), graph))
    assert all(isinstance(step, Region) for step in steps)
    return [(step.stream, [op(n) for n in step.nodes]) for step in steps]  # type: ignore[union-attr]


def test_a_mutation_joins_the_last_region_of_its_stream() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = node(graph, ops.sin.default, (x,), SIDE)
    node(graph, ops.add_.Tensor, (a, x), SIDE)
    graph.output(a)
    assert regions(graph) == [(SIDE, ["sin", "add_"])]


def test_a_mutation_does_not_move_before_another_streams_region() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = node(graph, ops.sin.default, (x,), SIDE)
    b = node(graph, ops.cos.default, (x,), MAIN)
    node(graph, ops.add_.Tensor, (a, x), SIDE)
    c = node(graph, ops.neg.default, (a,), SIDE)
    graph.output((b, c))
    # add_ may not join sin's region (it would run before cos); neg follows add_.
    assert regions(graph) == [(SIDE, ["sin"]), (MAIN, ["cos"]), (SIDE, ["add_", "neg"])]


def test_work_after_a_mutation_does_not_move_before_it() -> None:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = node(graph, ops.sin.default, (x,), SIDE)
    b = node(graph, ops.cos.default, (x,), MAIN)
    node(graph, ops.add_.Tensor, (b, x), MAIN)
    c = node(graph, ops.neg.default, (x,), SIDE)
    graph.output((a, c))
    # neg reads only x, but sin's region comes before add_: neg may not join it.
    assert regions(graph) == [(SIDE, ["sin"]), (MAIN, ["cos", "add_"]), (SIDE, ["neg"])]


def test_an_unannotated_factory_runs_on_its_users_stream() -> None:
    """Inductor adds its random ops' seeds after the package's passes, unannotated: made on
    the current stream, they were read on the side stream with no sync. A factory read on
    two streams gets a copy on each (Inductor makes one seeds tensor for all random ops)."""
    import torch._inductor.inductor_prims  # defines prims.inductor_seeds

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    seeds = node(graph, torch.ops.prims.inductor_seeds.default, (1, torch.device("cpu")), MAIN)
    shared = node(graph, ops.zeros.default, ([4],), MAIN)
    a = node(graph, ops.add.Tensor, (x, seeds), SIDE)
    b = node(graph, ops.mul.Tensor, (a, shared), SIDE)
    c = node(graph, ops.sub.Tensor, (x, shared), MAIN)
    graph.output((b, c))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    record(shared, "earlier_pass", "made here")
    assert copy_factories_per_stream(gm) == [
        "a copy of zeros_default for its readers on no stream block [zeros_default_1]"
    ]
    (copy,) = (n for n in gm.graph.nodes if n.name == "zeros_default_1")
    assert [str(r) for r in records(copy)] == [
        "earlier_pass: made here",
        "factories_per_stream: a copy of zeros_default for its readers on no stream block",
    ]
    assert [str(r) for r in records(shared)] == ["earlier_pass: made here"]
    assert regions(gm.graph) == [
        (SIDE, ["inductor_seeds", "zeros", "add", "mul"]),
        (MAIN, ["zeros", "sub"]),
    ]


def steps(graph: torch.fx.Graph, held: tuple[int, ...] = (7, 8)) -> list[str]:
    """``split``'s steps (the records of events ``held`` may be held back): a region as its
    stream and ops, a sync as its op and arguments."""
    described = []
    for step in split(torch.fx.GraphModule(torch.nn.Module(), graph), lambda e: e in held):
        if isinstance(step, Region):
            described.append(f"{step.stream}: {' '.join(op(n) for n in step.nodes)}")
        else:
            described.append(f"{step.op.__name__.split('.')[0]}{tuple(step.args)}")
    return described


def record_between_two_pieces(wait_on: int) -> torch.fx.Graph:
    """``sin`` and ``cos`` on stream 0, event 7 recorded between them, waited for (as index
    ``wait_on``) on stream 1 before ``neg``."""
    streams = torch.ops.streams
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = node(graph, ops.sin.default, (x,), SIDE)
    graph.call_function(streams.record_event.default, (7, SIDE))
    b = node(graph, ops.cos.default, (a,), SIDE)
    graph.call_function(streams.wait_event.default, (wait_on, 1))
    c = node(graph, ops.neg.default, (a,), 1)
    graph.call_function(streams.record_event.default, (8, 1))  # waited for by nobody
    graph.output((b, c))
    return graph


def test_a_record_is_held_until_the_next_wait() -> None:
    """A record of a package-made event between two pieces of a stream's work does not
    split them into two regions: it is issued after both, and still before the wait for it.
    The waiter then waits for more of stream 0's work than the graph said, never less."""
    assert steps(record_between_two_pieces(wait_on=7)) == [
        "0: sin cos",
        "record_event(7, 0)",
        "wait_event(7, 1)",
        "1: neg",
        "record_event(8, 1)",
    ]


def test_a_held_record_stays_held_past_a_wait_on_another_event() -> None:
    """Only records of package-made events are held, and each such index is an event no
    other index names (two indices may name one event only when the user passes it twice:
    ``f(x, s, m, e, e)``, not holdable). A wait for index 9 does not read event 7: the
    record stays held, and stream 0's later work still joins its region."""
    assert steps(record_between_two_pieces(wait_on=9)) == [
        "0: sin cos",
        "wait_event(9, 1)",
        "1: neg",
        "record_event(7, 0)",
        "record_event(8, 1)",
    ]


def test_a_wait_on_another_stream_closes_every_region() -> None:
    """Stream 1 may be stream 0 at run time (the user passes ``torch.cuda.current_stream()``
    as ``main``, and unannotated work runs there): ``cos`` after the wait does not join
    ``sin``'s region, issued before the wait (the prefetch program of ``test_races`` raced
    when it did)."""
    streams = torch.ops.streams
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = node(graph, ops.sin.default, (x,), SIDE)
    graph.call_function(streams.wait_event.default, (7, 1))
    b = node(graph, ops.cos.default, (a,), SIDE)
    graph.output(b)
    assert steps(graph, held=()) == ["0: sin", "wait_event(7, 1)", "0: cos"]


def test_the_current_stream_entry_and_unannotated_work_are_one_stream() -> None:
    """The passes read an unannotated node as running on the current stream (index 3 here):
    a wait on index 3 closes the unannotated work's region, and work annotated with index 3
    joins it."""
    streams = torch.ops.streams
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = node(graph, ops.sin.default, (x,), MAIN)
    b = node(graph, ops.cos.default, (a,), 3)
    graph.call_function(streams.wait_event.default, (7, 3))
    c = node(graph, ops.neg.default, (b,), MAIN)
    graph.output(c)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    described = [
        (step.stream, [op(n) for n in step.nodes]) if isinstance(step, Region) else "wait"
        for step in split(gm, current=frozenset({3}))
    ]
    assert described == [(None, ["sin", "cos"]), "wait", (None, ["neg"])]
    assert len(split(gm)) == 4, "without the current-stream index: sin | cos | wait | neg"


def test_a_users_event_is_recorded_where_the_user_records_it() -> None:
    """Not held: a timing event (``start.record(); work; end.record()``) would measure
    nothing, and a query or synchronize after the call would cover later work."""
    assert steps(record_between_two_pieces(wait_on=7), held=()) == [
        "0: sin",
        "record_event(7, 0)",
        "0: cos",
        "wait_event(7, 1)",
        "1: neg",
        "record_event(8, 1)",
    ]


def test_a_second_record_of_an_event_is_held_after_the_first() -> None:
    streams = torch.ops.streams
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = node(graph, ops.sin.default, (x,), SIDE)
    graph.call_function(streams.record_event.default, (7, SIDE))
    b = node(graph, ops.cos.default, (a,), SIDE)
    graph.call_function(streams.record_event.default, (7, SIDE))
    c = node(graph, ops.neg.default, (b,), SIDE)
    graph.output(c)
    assert steps(graph) == ["0: sin cos neg", "record_event(7, 0)", "record_event(7, 0)"]
