"""The launcher: a program written out as one Python function, syncs as method calls on the
call's own objects (each resolved once per call), a failed step found from its line."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from expecttest import TestCase

from torch_userstreams.errors import UserObjectError
from torch_userstreams.run.issue_syncs import ISSUERS
from torch_userstreams.run.plan import Program, Ref, Step
from torch_userstreams.run.state import state
from torch_userstreams.simulator import SimEvent, SimStream


def fork_join() -> Program:
    """``h = x * 2`` on stream 0; record event 1 there and wait for it on stream 2;
    ``y = h + x`` on stream 2; the dealloc wait holds ``h`` until stream 0 waits for it."""
    return Program(
        4,
        [0],
        [
            Step(torch.mul, (Ref(0), 2), stream=0, output=1),
            Step(ISSUERS["record_event"], (1, 0)),
            Step(ISSUERS["wait_event"], (1, 2)),
            Step(torch.add, (Ref(1), Ref(0)), {"alpha": 3}, stream=2, output=2),
            Step(ISSUERS["sync_dealloc"], (1, 0, Ref(1))),
        ],
        (Ref(2),),
    )


def bound(*objects: object) -> tuple[object, ...]:
    """A binding as the prologue builds it: its graph first, then the call's objects."""
    graph = SimpleNamespace(table=SimpleNamespace(graph_name="g [0/0]"))
    return (graph, *objects)


class TestLauncher(TestCase):
    def test_source(self) -> None:
        self.assertExpectedInline(
            fork_join().launcher.source,
            """\
def launch(v0):
    o0 = lookup(0)
    o1 = lookup(1)
    o2 = lookup(2)
    with o0:
        v1 = k0(v0, 2)
    o1.record(o0)
    o1.wait(o2)
    with o2:
        v2 = k1(v1, v0, alpha=3)
    v0 = None
    o1.wait(o0)
    v1 = None
    return (v2, )
""",
        )


def test_a_call_uses_its_own_objects_and_gives_eager_values() -> None:
    side, event, main = SimStream(device="cpu"), SimEvent(device="cpu"), SimStream(device="cpu")
    x = torch.arange(3.0)
    state.calls.current = bound(side, event, main)
    try:
        (y,) = fork_join().run([x])
    finally:
        state.calls.current = None
    torch.testing.assert_close(y, x * 2 + 3 * x)
    assert event.log == [("record", side), ("wait", main), ("wait", side)]


def test_a_failed_sync_is_diagnosed_as_its_step() -> None:
    """Object 1 is a stream where the record takes an event: the error names the step's
    sync and the object, as the interpreter did."""
    streams = [SimStream(device="cpu") for _ in range(3)]
    state.calls.current = bound(*streams)
    try:
        with pytest.raises(
            UserObjectError,
            match=r"in graph g \[0/0\], the sync record_event takes an event as argument 0",
        ):
            fork_join().run([torch.ones(2)])
    finally:
        state.calls.current = None


def keywords(a: torch.Tensor, **named: int) -> torch.Tensor:
    return a + sum(named.values())


def test_what_is_no_table_index_or_identifier_is_written_so_that_it_compiles() -> None:
    """A negative index was written as the name ``o-1``, a keyword ``from=`` as such: the
    launcher failed to compile with a SyntaxError instead of the lookup's own error
    (helper-1's review)."""
    program = Program(
        3,
        [0],
        [
            Step(keywords, (Ref(0),), {"from": 1, "a-b": 2, "ok": 3}, stream=-1, output=1),
            Step(ISSUERS["record_event"], (-1, 0)),
        ],
        Ref(1),
    )
    lines = program.launcher.source.splitlines()
    assert lines[1:3] == [
        "    with lookup(-1):",
        "        v1 = k0(v0, **{'from': 1}, **{'a-b': 2}, ok=3)",
    ]
    assert "    k1(-1, 0)" in lines  # the issuer, whose lookup says what is wrong
    with pytest.raises(UserObjectError, match=r"lookup\(-1\)"):
        program.run([torch.ones(1)])


class Entries:
    """A boxed step's two entries, each counting its calls (the list is the callee's)."""

    def __init__(self) -> None:
        self.full = 0
        self.direct = 0

    def full_entry(self, args: list[torch.Tensor]) -> tuple[torch.Tensor]:
        self.full += 1
        (x,) = args
        args.clear()
        return (x + 1,)

    def direct_entry(self, args: list[torch.Tensor]) -> tuple[torch.Tensor]:
        self.direct += 1
        (x,) = args
        args.clear()
        return (x + 1,)


def boxed_program(entries: Entries) -> Program:
    step = Step(
        entries.full_entry, (Ref(0),), outputs=(1,), boxed=True, direct=entries.direct_entry
    )
    return Program(2, [0], [step], (Ref(1),))


def test_a_boxed_step_is_called_with_one_list() -> None:
    lines = boxed_program(Entries()).launcher.source.splitlines()
    assert lines[1] == "    v1, = k0([v0])"


def test_calls_take_the_direct_entry_after_the_first_unless_watched() -> None:
    """The first call, and any call a race detector or the profiler watches, goes through
    the full entry (Inductor's bookkeeping, the detector's view of compiled code); the
    others through the direct one. Values are the same either way."""
    from torch_userstreams.observe import watching
    from torch_userstreams.testing.races import RaceDetector

    entries = Entries()
    run = boxed_program(entries).boxed()
    x = torch.arange(2.0)
    results = [run([x]), run([x]), run([x])]
    assert (entries.full, entries.direct) == (1, 2)
    with watching(RaceDetector(None)):
        results.append(run([x]))
    with torch.autograd.profiler.profile():
        results.append(run([x]))
    assert (entries.full, entries.direct) == (3, 2)
    for (y,) in results:
        torch.testing.assert_close(y, x + 1)


def test_a_step_failing_in_its_direct_entry_is_found_from_its_line() -> None:
    """Both launchers run one code object, so a traceback from either names the step:
    a failure in the direct entry, then one in the full entry."""
    from torch_userstreams.run.launcher import failed_step

    def broken(args: list[torch.Tensor]) -> None:
        raise RuntimeError("kernel failed")

    first = Step(torch.neg, (Ref(0),), output=1)
    second = Step(Entries().full_entry, (Ref(1),), outputs=(2,), boxed=True, direct=broken)
    program = Program(3, [0], [first, second], (Ref(2),))
    with pytest.raises(RuntimeError, match="kernel failed") as raised:
        program.run([torch.ones(1)], watched=False)
    assert failed_step(program.launcher, raised.value) == 1
    watched_broken = Step(broken, (Ref(1),), outputs=(2,), boxed=True, direct=Entries().full_entry)
    program = Program(3, [0], [first, watched_broken], (Ref(2),))
    with pytest.raises(RuntimeError, match="kernel failed") as raised:
        program.run([torch.ones(1)])
    assert failed_step(program.launcher, raised.value) == 1
