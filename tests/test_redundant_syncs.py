"""``backends.redundant_syncs``: which waits of a region program are left out, on hand-built
step lists (streams: 0 the current stream, 2 and 3 side streams; events 10-19 package-made,
7 a user's)."""

from __future__ import annotations

from typing import Any

import torch

from torch_userstreams.backends.redundant_syncs import without_redundant_waits
from torch_userstreams.backends.regions import Region, Step
from torch_userstreams.fx.control_deps import SyncCall

streams = torch.ops.streams
CURRENT = frozenset({0})


def work(stream: int | None) -> Region:
    return Region(stream)


def record(event: int, stream: int) -> SyncCall:
    return SyncCall(None, streams.record_event.default, (event, stream))  # type: ignore[arg-type]


def wait(event: int, stream: int) -> SyncCall:
    return SyncCall(None, streams.wait_event.default, (event, stream))  # type: ignore[arg-type]


def wait_stream(stream: int, other: int) -> SyncCall:
    return SyncCall(None, streams.wait_stream.default, (stream, other))  # type: ignore[arg-type]


def pruned(*steps: Step) -> list[str]:
    kept = without_redundant_waits(list(steps), lambda event: event >= 10, CURRENT)
    return [_describe(step) for step in kept]


def _describe(step: Any) -> str:
    if isinstance(step, Region):
        return f"work@{step.stream}"
    name = step.op.__name__.split(".")[0]
    return f"{name}{tuple(step.args)}"


def test_one_wait_joins_a_stream_back_for_all_its_events() -> None:
    """A backward's exit: two gradients made on stream 2, one event each. Waiting for the
    later record orders the earlier one too; the unread record goes with its wait."""
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
    assert pruned(work(2), record(10, 2), wait(10, 0), work(2), record(11, 2), wait(11, 0)) == [
        "work@2",
        "record_event(10, 2)",
        "wait_event(10, 0)",
        "work@2",
        "record_event(11, 2)",
        "wait_event(11, 0)",
    ]


def test_orderings_compose_through_other_streams() -> None:
    """3 waits for 2; the current stream waits for 3 after that: it is then after 2's
    work, and its own wait for 2's event is left out."""
    assert pruned(
        work(2),
        record(10, 2),
        wait(10, 3),
        work(3),
        record(11, 3),
        wait(11, 0),
        record(12, 2),
        wait(12, 0),
    )[-3:] == ["work@3", "record_event(11, 3)", "wait_event(11, 0)"]


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
    from torch_userstreams.backends.inductor_regions import the_current_stream
    from torch_userstreams.compile.table import EntryKind, UserObjectTable

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
