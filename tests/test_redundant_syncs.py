"""``inductor.redundant_syncs``: which waits of a region program are left out, on hand-built
step lists (streams: 0 the current stream, 2 and 3 side streams; events 10-19 package-made,
7 a user's)."""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_userstreams.fx.control_deps import SyncCall
from torch_userstreams.inductor.redundant_syncs import (
    Judgement,
    pairs_on_one_stream,
    without_redundant_waits,
)
from torch_userstreams.inductor.regions import Region, Step
from torch_userstreams.run.own_ops import sync_op

streams = torch.ops.streams
CURRENT = frozenset({0})


def work(stream: int | None) -> Region:
    return Region(stream)


def record(event: int, stream: int) -> SyncCall:
    return SyncCall(None, streams.record_event.default, (event, stream))  # type: ignore[arg-type]


def wait(event: int, stream: int) -> SyncCall:
    return SyncCall(None, streams.wait_event.default, (event, stream))  # type: ignore[arg-type]


def dealloc(event: int, stream: int) -> SyncCall:
    return SyncCall(None, streams.sync_dealloc.default, (event, stream, None))  # type: ignore[arg-type]


def synchronize_stream(stream: int) -> SyncCall:
    # (torch 2.11 has no ``streams::synchronize_stream``: the package's own op stands in)
    return SyncCall(None, sync_op("synchronize_stream"), (stream,))


def wait_stream(stream: int, other: int) -> SyncCall:
    return SyncCall(None, streams.wait_stream.default, (stream, other))  # type: ignore[arg-type]


# Every stream index of the program may name one stream (the frame's own streams).
SHARED = frozenset({0, 2, 3})


def pruned(*steps: Step, shared: frozenset[int] = frozenset()) -> list[str]:
    kept = without_redundant_waits(list(steps), lambda event: event >= 10, CURRENT, shared)
    return [_describe(step) for step in kept]


def _describe(step: Any) -> str:
    if isinstance(step, Region):
        return f"work@{step.stream}"
    name = step.op.__name__.split(".")[0]
    return f"{name}{tuple(step.args)}"


def test_one_wait_joins_a_stream_back_for_all_its_events() -> None:
    """A backward's exit: gradients made on stream 2, one event each. Waiting for the
    first record made after the last of them orders them all; the unread records go with
    their waits."""
    assert pruned(
        work(2),
        record(10, 2),
        work(2),
        record(11, 2),
        record(12, 2),
        wait(11, 0),
        wait(12, 0),
        wait(10, 0),
    ) == ["work@2", "work@2", "record_event(11, 2)", "wait_event(11, 0)"]


def test_a_wait_for_an_earlier_point_than_the_stream_reached_is_kept() -> None:
    steps = [work(2), record(10, 2), wait(10, 0), work(0), work(2), record(11, 2), wait(11, 0)]
    assert pruned(*steps) == [_describe(step) for step in steps]


def test_orderings_compose_through_other_streams() -> None:
    """3 waits for 2; the current stream waits for 3 after that: it is then after 2's
    event, and its own wait for it is left out; so is its wait for a later record on 2,
    with nothing run on 2 since. Unless index 3 may name stream 2: its work may be 2's."""
    steps = [work(2), record(10, 2), wait(10, 3), work(3), record(11, 3), wait(11, 0)]
    assert pruned(*steps, wait(10, 0)) == [_describe(step) for step in steps]
    later = [*steps, record(12, 2), wait(12, 0)]
    assert pruned(*later) == [_describe(step) for step in steps]
    assert pruned(*later, shared=SHARED) == [_describe(step) for step in later]


def test_unannotated_work_is_the_current_streams() -> None:
    assert pruned(work(None), record(10, 0), wait(10, 0), work(None)) == ["work@None", "work@None"]


def test_a_users_event_is_not_judged_and_orders_nothing_here() -> None:
    """Index 7 may name the same event as another index the user passed: its waits stay,
    and what a wait for it orders is not counted (the package's wait for 2 stays)."""
    assert pruned(
        work(2), record(7, 2), wait(7, 0), record(7, 2), wait(7, 0), record(10, 2), wait(10, 0)
    ) == [
        "work@2",
        "record_event(7, 2)",
        "wait_event(7, 0)",
        "record_event(7, 2)",
        "wait_event(7, 0)",
        "record_event(10, 2)",
        "wait_event(10, 0)",
    ]


def test_an_event_recorded_before_the_graph_is_waited_for() -> None:
    """A backward's wait for an event its forward recorded: nothing here says where."""
    assert pruned(wait(10, 0), work(0)) == ["wait_event(10, 0)", "work@0"]


def test_a_record_before_any_work_marks_the_work_before_the_graph() -> None:
    """A backward's first record on the current stream covers what the caller issued there
    (the incoming gradients): a side stream has not waited for that, whatever it did."""
    assert pruned(work(2), record(10, 0), wait(10, 2), work(2)) == [
        "work@2",
        "record_event(10, 0)",
        "wait_event(10, 2)",
        "work@2",
    ]


def test_a_wait_stream_orders_what_follows() -> None:
    """The current stream waits for all stream 2 issued so far: a record made on 2 before
    is covered, and one made after with nothing run on 2 since."""
    assert pruned(work(2), record(10, 2), wait_stream(0, 2), wait(10, 0)) == [
        "work@2",
        "wait_stream(0, 2)",
    ]
    assert pruned(work(2), wait_stream(0, 2), record(10, 2), wait(10, 0)) == [
        "work@2",
        "wait_stream(0, 2)",
    ]


def test_work_on_a_current_stream_index_counts_as_the_current_streams() -> None:
    """(helper-2's review) A region named by the current-stream index is the current stream's
    work: a record on that index after it covers it, and the later wait stays."""
    assert pruned(work(0), record(10, 0), wait(10, 2), work(0), record(11, 0), wait(11, 2))[
        -2:
    ] == ["record_event(11, 0)", "wait_event(11, 2)"]


def test_a_graph_whose_current_stream_is_not_known_keeps_every_wait() -> None:
    """Two devices' current streams (helper-2's review): unannotated work is on one of them,
    which ``split`` cannot say, so a record on index 0 may not cover it; the backend then
    leaves every sync in place."""
    from torch_userstreams.compile.table import EntryKind, UserObjectTable
    from torch_userstreams.inductor.redundant_syncs import the_current_stream

    table = UserObjectTable("g")
    for device in ("cuda:0", "cuda:1"):
        index = table.add(
            EntryKind.CURRENT_STREAM,
            device,
            lambda cg: None,
            torch.Stream(device="cpu"),
            added_by="test",
        )
        table.entries[index].device = torch.device(device)
    assert the_current_stream(table) == frozenset()


def test_a_wait_a_later_wait_of_the_same_stream_covers_is_left_out() -> None:
    """A backward's exit waits for two events recorded on stream 3, the second after more
    work there: the second wait alone orders the current stream after both records, and
    the first record, read by nothing then, goes with its wait."""
    assert pruned(
        work(3), record(11, 3), work(3), record(12, 3), wait(11, 0), wait(12, 0), work(0)
    ) == ["work@3", "work@3", "record_event(12, 3)", "wait_event(12, 0)", "work@0"]


def test_a_wait_covered_later_stays_when_its_stream_is_read_between() -> None:
    """Work on the waiting stream, a record on it, or a wait_stream for it between the two
    waits reads the order the first wait gave: it stays."""
    first = [work(3), record(11, 3), work(3), record(12, 3), wait(11, 0)]
    for between in ([work(0)], [record(13, 0), wait(13, 2)], [wait_stream(2, 0)]):
        kept = pruned(*first, *between, wait(12, 0))
        assert "wait_event(11, 0)" in kept, between


def test_a_wait_is_covered_by_a_later_dealloc_sync_which_stays() -> None:
    """A deallocation sync orders its stream as a wait does; it also holds its buffer's
    memory, so it stays even when an earlier wait covers it."""
    assert pruned(work(3), record(11, 3), work(3), record(12, 3), wait(11, 0), dealloc(12, 0)) == [
        "work@3",
        "work@3",
        "record_event(12, 3)",
        "sync_dealloc(12, 0, None)",
    ]
    assert pruned(work(3), record(11, 3), work(3), record(12, 3), wait(12, 0), dealloc(11, 0))[
        -2:
    ] == ["wait_event(12, 0)", "sync_dealloc(11, 0, None)"]


def test_a_later_wait_for_another_stream_covers_nothing() -> None:
    steps = [work(2), record(10, 2), work(3), record(11, 3), wait(10, 0), wait(11, 0)]
    assert pruned(*steps) == [_describe(step) for step in steps]


def test_a_record_after_a_wait_for_a_users_event_covers_what_that_event_did() -> None:
    """Stream 2 waits for the user's event 7, recorded after the current stream's work; a
    record on 2 then covers that work. Stream 3 was after everything else stream 2 had
    done (found by the property below): its wait stays."""
    steps = [wait_stream(3, 2), work(0), record(7, 0), wait(7, 2), record(10, 2), wait(10, 3)]
    assert pruned(*steps) == [_describe(step) for step in steps]


def test_the_host_waiting_for_the_stream_reads_the_order_a_wait_gave_it() -> None:
    """Host code after ``synchronize()`` of the current stream may read what stream 3 made
    before event 11's record: the wait for it stays, though a later wait covers it."""
    steps = [work(3), record(11, 3), work(3), record(12, 3)]
    steps += [wait(11, 0), synchronize_stream(0), wait(12, 0)]
    assert pruned(*steps) == [_describe(step) for step in steps]


def test_work_on_another_index_may_be_on_the_recording_stream() -> None:
    """Index 3 may name stream 2 (a user passed one stream twice): a record on 2 after work
    on 3 may cover that work, which the current stream has not waited for."""
    steps = [work(2), wait_stream(0, 2), work(3), record(10, 2), wait(10, 0), work(0)]
    assert pruned(*steps, shared=SHARED) == [_describe(step) for step in steps]
    assert "wait_event(10, 0)" not in pruned(*steps)  # (no index names another's stream)


def test_a_record_after_a_wait_covers_more_than_one_before() -> None:
    """Stream 2 waits for stream 3's event between its two records: the second covers 3's
    work too, so the current stream's wait for it stays, and the wait for the first goes."""
    steps = [work(3), record(10, 3), record(11, 2), wait(10, 2), record(12, 2)]
    assert pruned(*steps, wait(11, 0), wait(12, 0), work(0)) == [
        "work@3",
        "record_event(10, 3)",
        "wait_event(10, 2)",
        "record_event(12, 2)",
        "wait_event(12, 0)",
        "work@0",
    ]


def test_unannotated_work_may_be_on_a_frame_stream() -> None:
    """Without a current-stream entry, unannotated work runs on the caller's current stream,
    which may be one of the frame's streams (found by helper-15)."""
    steps = [record(10, 2), wait(10, 1), work(None), record(11, 2), wait(11, 1), work(1)]
    kept = without_redundant_waits(steps, lambda event: event >= 10, frozenset(), frozenset({2}))
    assert [_describe(step) for step in kept] == [_describe(step) for step in steps]


def test_a_forward_keeps_its_records_for_its_backward() -> None:
    """A forward graph's record no wait of its own reads may be waited for by its backward."""
    steps = [work(2), record(10, 2)]
    kept = without_redundant_waits(steps, lambda event: event >= 10, CURRENT, keep_records=True)
    assert [_describe(step) for step in kept] == ["work@2", "record_event(10, 2)"]
    assert pruned(*steps) == ["work@2"]


# Programs of the steps above over streams 0, 2 and 3: events 10-12 the package's (waited
# only after a record in the program, as the passes place them), 7 a user's (anywhere). Two
# waits of one stream with one step between them come often, as at a backward's exit.
_STREAMS = st.sampled_from([0, 2, 3])
_EVENTS = st.sampled_from([7, 10, 11, 12])
_ONE = st.one_of(
    st.builds(work, _STREAMS),
    st.builds(record, _EVENTS, _STREAMS),
    st.builds(wait, _EVENTS, _STREAMS),
    st.builds(dealloc, st.sampled_from([10, 11, 12]), _STREAMS),
    st.builds(wait_stream, _STREAMS, _STREAMS),
    st.builds(synchronize_stream, _STREAMS),
)


@st.composite
def _two_waits(draw: st.DrawFn) -> list[Step]:
    """Two records on one stream, then waits for both on another, one step between them:
    the second wait covers the first unless that step reads the waiting stream's order."""
    recorded_on, waiting = draw(_STREAMS), draw(_STREAMS)
    first, second = draw(st.permutations([7, 10, 11, 12]))[:2]
    more = draw(st.lists(st.just(work(recorded_on)), max_size=1))
    between = draw(st.lists(_ONE, max_size=1))
    then = draw(st.sampled_from([wait, dealloc])) if second >= 10 else wait
    return [
        record(first, recorded_on),
        *more,
        record(second, recorded_on),
        wait(first, waiting),
        *between,
        then(second, waiting),
    ]


@st.composite
def _order_then_record(draw: st.DrawFn) -> list[Step]:
    """A stream ordered after another, then a record there after work on some index, and a
    wait for it: covered only if that work was on no index naming the recording stream."""
    waiting, recording, working = draw(_STREAMS), draw(_STREAMS), draw(_STREAMS)
    event = draw(st.sampled_from([10, 11, 12]))
    order = draw(st.sampled_from([wait_stream(waiting, recording), None]))
    first = [record(event, recording), wait(event, waiting)] if order is None else [order]
    return [*first, work(working), record(event, recording), wait(event, waiting)]


_PROGRAMS = st.lists(
    st.one_of(_ONE.map(lambda step: [step]), _two_waits(), _order_then_record()), max_size=16
).map(lambda chunks: [step for chunk in chunks for step in chunk])


def _as_placed(steps: list[Step]) -> list[Step]:
    """Each package wait after a record of its event (the passes never wait first)."""
    recorded: set[int] = set()
    placed = []
    for step in steps:
        if isinstance(step, SyncCall):
            name, event = step.op.__name__.split(".")[0], step.args[0]
            if name == "record_event":
                recorded.add(event)
            elif name in ("wait_event", "sync_dealloc") and event >= 10 and event not in recorded:
                continue
        placed.append(step)
    return placed


def _orders(
    steps: list[Step], named: dict[int, int]
) -> tuple[dict[int, frozenset[int]], dict[Any, frozenset[int]]]:
    """GPU semantics of ``steps``, index ``i`` naming stream ``named[i]``: for each work
    step (by identity), the work it runs after; at the end, each stream's order and each
    user event's last record (what the caller's later work and syncs see)."""
    after: dict[int, frozenset[int]] = {}
    order: dict[int, set[int]] = {0: set(), 2: set(), 3: set()}
    events: dict[int, frozenset[int]] = {}
    for step in steps:
        if isinstance(step, Region):
            stream = named[0 if step.stream is None else step.stream]
            after[id(step)] = frozenset(order[stream])
            order[stream].add(id(step))
            continue
        name, args = step.op.__name__.split(".")[0], step.args
        if name == "record_event":
            events[args[0]] = frozenset(order[named[args[1]]])
        elif name == "wait_stream":
            order[named[args[0]]] |= order[named[args[1]]]
        elif name == "synchronize_stream":  # the host waits: all later work comes after
            for each in order.values():
                each |= order[named[args[0]]]
        else:
            order[named[args[1]]] |= events.get(args[0], frozenset())
    final = {("stream", s): frozenset(o) for s, o in order.items()}
    final.update({("user event", e): m for e, m in events.items() if e < 10})
    return after, final


# Which stream each index names: its own, or one index names another's stream (a user
# passed the current stream as a side stream, or one side stream twice).
_NAMED = st.sampled_from(
    [{0: 0, 2: 2, 3: 3}, {0: 0, 2: 2, 3: 2}, {0: 0, 2: 0, 3: 3}, {0: 0, 2: 2, 3: 0}]
)


@settings(max_examples=2000, deadline=None)
@given(_PROGRAMS, _NAMED, st.booleans())
def test_what_is_left_out_changes_no_order(
    drawn: list[Step], named: dict[int, int], said: bool
) -> None:
    """Every work step runs after the same work as before, and the graph ends with each
    stream and each user event ordered as before, whichever stream each index names, as
    long as the indices that may name one stream are said (they may be said needlessly)."""
    steps = _as_placed(drawn)
    aliased = any(index != stream for index, stream in named.items())
    shared = SHARED if aliased or said else frozenset()
    kept = without_redundant_waits(steps, lambda event: event >= 10, CURRENT, shared)
    assert _orders(kept, named) == _orders(steps, named)


def _package(event: Any) -> bool:
    return bool(event >= 10)


def test_a_record_and_its_one_wait_between_two_indices_of_one_stream_are_guarded() -> None:
    """A package event recorded on the current stream's index and waited on a frame stream
    that may be the same object (the demo's ``main``): both syncs get the two indices, and
    a dealloc sync is a wait like any other."""
    steps = [work(0), record(10, 0), wait(10, 2), work(2), record(11, 2), dealloc(11, 0)]
    assert pairs_on_one_stream(steps, _package, SHARED) == {
        1: (0, 2),
        2: (0, 2),
        4: (2, 0),
        5: (2, 0),
    }


def test_no_guard_where_the_indices_are_two_streams_or_the_event_is_read_again() -> None:
    # A stream the graph makes (not shared) is never another index's stream.
    assert pairs_on_one_stream([record(10, 0), wait(10, 4)], _package, SHARED) == {}
    # One index on both sides: nothing to check at run time (the judge's own business).
    assert pairs_on_one_stream([record(10, 2), wait(10, 2)], _package, SHARED) == {}
    # A user's event may be read after the graph.
    assert pairs_on_one_stream([record(7, 0), wait(7, 2)], _package, SHARED) == {}
    # Waited on two streams, recorded twice, or waited before its record.
    twice = [record(10, 0), wait(10, 2), wait(10, 3)]
    again = [record(10, 0), wait(10, 2), record(10, 3)]
    assert pairs_on_one_stream(twice, _package, SHARED) == {}
    assert pairs_on_one_stream(again, _package, SHARED) == {}
    assert pairs_on_one_stream([wait(10, 2), record(10, 0)], _package, SHARED) == {}


def test_a_forward_guards_nothing() -> None:
    """A forward's record may be waited for by its backward, where this cannot see it."""
    steps = [record(10, 0), wait(10, 2)]
    forward = Judgement((10,), (0,), (0, 2, 3), keep_records=True)
    backward = Judgement((10,), (0,), (0, 2, 3), keep_records=False)
    assert forward.pairs_on_one_stream(steps) == {}
    assert backward.pairs_on_one_stream(steps) == {0: (0, 2), 1: (0, 2)}


@settings(max_examples=2000, deadline=None)
@given(_PROGRAMS, _NAMED)
def test_the_pairs_skipped_where_two_indices_name_one_stream_change_no_order(
    drawn: list[Step], named: dict[int, int]
) -> None:
    """After the redundant waits are left out, a backward skips each guarded pair whose two
    indices name one stream: every work step still runs after the same work, and the graph
    ends with each stream and each user event ordered as before."""
    steps = _as_placed(drawn)
    kept = without_redundant_waits(steps, _package, CURRENT, SHARED)
    guards = pairs_on_one_stream(kept, _package, SHARED)
    run = [
        step
        for position, step in enumerate(kept)
        if position not in guards or named[guards[position][0]] != named[guards[position][1]]
    ]
    assert _orders(run, named) == _orders(steps, named)
