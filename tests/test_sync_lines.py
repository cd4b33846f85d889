"""``inductor.sync_lines``: a graph compiled as one call issues the syncs its own
code needs: the waits its order makes redundant are left out, and a stream block is
entered once where nothing but syncs or comments came between two of its blocks. Judged
on the demo's training step, as on a GPU: the fake accelerator with GPU semantics and the
run-time race detector."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest
import torch
from helpers import LAST_BINDING
from test_one_call import gpu_like  # noqa: F401 (a fixture)
from torch._inductor.utils import run_and_get_code

from benchmarks.accelerator_step import model
from torch_userstreams.backends import inductor_graphs
from torch_userstreams.backends.inductor_graphs import inductor_runs_streams
from torch_userstreams.compile.table import EntryKind
from torch_userstreams.demo.model import ForwardAndLoss, make_batches
from torch_userstreams.inductor import sync_lines
from torch_userstreams.inductor.launch_code import objects_resolved
from torch_userstreams.testing.races import RaceReport, detect_races

pytestmark = [pytest.mark.usefixtures("gpu_like")]

SYNC = re.compile(r"\.(record|wait)\(")
BLOCK = re.compile(r"^(\s*)with (\w+):$", re.MULTILINE)


def training_step(
    monkeypatch: pytest.MonkeyPatch, judged: bool
) -> tuple[list[str], RaceReport, list[torch.Tensor]]:
    """The demo's step with its loss (two side-stream blocks), forward and backward: the code
    of its two calls, what the race detector saw, and the gradients."""
    if not judged:
        monkeypatch.setattr(inductor_graphs, "judgement", lambda table, backward: None)
    torch._dynamo.reset()
    net = model(streams=True)
    loss_of = torch.compile(ForwardAndLoss(net), backend="userstreams")
    x, y = make_batches(1, 64, 64, torch.device("cpu"), 0)[0]
    with detect_races() as report:
        _, code = run_and_get_code(lambda: loss_of(x, y).backward())
    grads = [p.grad for p in net.parameters() if p.grad is not None]
    monkeypatch.undo()
    return code, report, grads


def _call(module: str) -> str:
    return module[module.index("def call(") :]


def test_the_backward_issues_fewer_syncs_and_blocks_with_the_same_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    every, every_report, every_grads = training_step(monkeypatch, judged=False)
    code, report, grads = training_step(monkeypatch, judged=True)
    assert every_report and report, (every_report, report)
    assert len(code) == 2 == len(every), "one call for the forward, one for the backward"
    forward, backward = map(_call, code)
    every_forward, every_backward = map(_call, every)
    # The forward's syncs are the user's, all issued; the backward's exit waits once per
    # stream instead of once per gradient.
    assert len(SYNC.findall(forward)) == len(SYNC.findall(every_forward)) > 0
    assert 0 < len(SYNC.findall(backward)) < len(SYNC.findall(every_backward))
    # On 2.11 a sync stays in the block open (``inductor.placed_streams``): no block of
    # nothing but syncs to join.
    blocks, every_blocks = len(BLOCK.findall(backward)), len(BLOCK.findall(every_backward))
    assert blocks < every_blocks or (blocks == every_blocks and not inductor_runs_streams())
    for ours, theirs in zip(grads, every_grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


# A sync a backward issues only where its two streams are different streams.
GUARDED = re.compile(r"if user_object(\d+) != user_object(\d+): user_object(\d+)\.record\(")


def _guarded_records(backward: str, binding: Any) -> tuple[list[Any], list[Any]]:
    """The events of ``backward``'s guarded pairs: those whose two streams were one stream
    in the call of ``binding``, and the others."""
    same, apart = [], []
    for one, other, event in GUARDED.findall(backward):
        a, b = binding[1 + int(one)], binding[1 + int(other)]
        (same if a == b else apart).append(binding[1 + int(event)])
    return same, apart


def test_a_backward_skips_a_pair_between_two_indices_that_name_one_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The demo's main stream is the current stream, and both are indices of its backward:
    a package event recorded on one and waited on the other is guarded by a comparison of
    the two, and the call records none of those; the pairs between two streams (a side
    stream and the current one, or two side streams) are recorded and waited. The race
    detector finds no race."""
    code, report, _ = training_step(monkeypatch, judged=True)
    same, apart = _guarded_records(_call(code[1]), LAST_BINDING[0])
    assert same, "the current stream and main are one stream: their pairs are skipped"
    assert apart, "the side streams are streams of their own"
    assert not any(event.recorded for event in same)
    assert all(event.recorded for event in apart)
    assert all(any(kind == "wait" for kind, _ in event.log) for event in apart)
    report.assert_no_races()


def test_no_block_follows_one_of_its_own_stream_or_is_empty(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, report, _ = training_step(monkeypatch, judged=True)
    assert report, report
    for module in map(_call, code):
        compile(module, "<call>", "exec")  # an emptied block would not parse
        names = _outer_blocks(module)
        assert all(a != b for a, b in itertools.pairwise(names)), names


def _outer_blocks(call: str) -> list[str | None]:
    """The stream blocks at the outer level of ``call``'s body, in order, with None for code
    between them outside any block (2.11 runs unannotated work outside blocks; 2.12+ in
    ``default_stream``'s)."""
    blocks = BLOCK.findall(call)
    outer = min(indent for indent, _ in blocks)
    names: list[str | None] = []
    for line in call.splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        if not line.strip() or line.lstrip().startswith("#") or indent > len(outer):
            continue
        if indent < len(outer):
            break  # the end of ``call``
        block = re.fullmatch(r"with (\w+):", line.strip())
        name = block.group(1) if block else None
        if block or not names or names[-1] is not None:
            names.append(name)
    return names


@pytest.fixture(params=["inductor", "package"])
def kind(request: pytest.FixtureRequest) -> tuple[type, type]:
    """The lines of a stream block: Inductor's own (2.12+) or the package's (2.11), which
    ``sync_lines`` reads alike."""
    from torch._inductor.codegen import wrapper

    from torch_userstreams.inductor.wrapper_lines import block_lines

    if request.param == "package":
        return block_lines()
    if not hasattr(wrapper, "EnterCudaStreamContextLine"):
        pytest.skip("Inductor 2.11 writes no stream block of its own")
    return wrapper.EnterCudaStreamContextLine, wrapper.ExitCudaStreamContextLine


def _lines(kind: tuple[type, type], *spec: Any) -> list[Any]:
    from torch._inductor.codegen.wrapper import CommentLine
    from torch._inductor.utils import LineContext

    enter, leave = kind
    package = "stream_idx" in enter.__dataclass_fields__ and "index" in enter.__dataclass_fields__
    made: list[Any] = []
    for item in spec:
        if isinstance(item, int):
            made.append(enter(item, item + 10) if package else enter(item))
        elif item == "exit":
            made.append(leave())
        elif item == "#":
            made.append(CommentLine(LineContext("# a comment")))
        else:
            made.append(item)
    return made


def _shape(kind: tuple[type, type], lines: list[Any]) -> list[Any]:
    enter, leave = kind
    return [
        line.stream_idx if isinstance(line, enter) else "exit" if isinstance(line, leave) else line
        for line in lines
        if isinstance(line, (str, enter, leave))
    ]


def test_an_emptied_block_goes_and_the_blocks_around_it_become_one(
    kind: tuple[type, type],
) -> None:
    from torch_userstreams.inductor.sync_lines import _joined_blocks

    lines = _lines(kind, 1, "k1()", "exit", 0, "#", "exit", 1, "k2()", "exit", 2, "k3()", "exit")
    assert _shape(kind, _joined_blocks(lines)) == [1, "k1()", "k2()", "exit", 2, "k3()", "exit"]
    # Work on the current stream between two blocks of stream 1 keeps them apart.
    lines = _lines(kind, 1, "k1()", "exit", 0, "k0()", "exit", 1, "k2()", "exit")
    assert _shape(kind, _joined_blocks(lines)) == _shape(kind, lines)
    # So does code outside any block.
    lines = _lines(kind, 1, "k1()", "exit", "x = 1", 1, "k2()", "exit")
    assert _shape(kind, _joined_blocks(lines)) == _shape(kind, lines)


def test_the_last_block_left_open_stays_open(kind: tuple[type, type]) -> None:
    """Inductor leaves the last block open (a device guard's exit closes it on a GPU): an
    emptied one keeps a ``pass``, and a block of syncs on the current stream joins the
    closed block before it, which stays open in its place."""
    from torch_userstreams.inductor.sync_lines import _joined_blocks

    lines = _lines(kind, 1, "k1()", "exit", 0, "#")
    assert _shape(kind, _joined_blocks(lines)) == [1, "k1()"]  # joined: block 1 is now the open one
    lines = _lines(kind, "guard()", 2, "#")
    assert _shape(kind, _joined_blocks(lines)) == ["guard()", 2, "pass"]


def test_an_emptied_block_inside_other_code_keeps_a_pass(
    kind: tuple[type, type],
) -> None:
    """After a line that is no block (a device guard, a memory pool's ``with``), the
    emptied block may be all that line holds: it stays, with a ``pass``."""
    from torch_userstreams.inductor.sync_lines import _joined_blocks

    lines = _lines(kind, "with pool():", 1, "#", "exit", 2, "k2()", "exit")
    assert _shape(kind, _joined_blocks(lines)) == [
        "with pool():",
        1,
        "pass",
        "exit",
        2,
        "k2()",
        "exit",
    ]


def test_each_call_builds_only_the_events_its_code_resolves() -> None:
    """An event the passes requested for syncs the one call left out is not built: each
    call's prologue builds the events the compiled code resolves (``objects_resolved``)."""
    torch._dynamo.reset()
    net = model(streams=True)
    loss_of = torch.compile(ForwardAndLoss(net), backend="userstreams")
    x, y = make_batches(1, 64, 64, torch.device("cpu"), 0)[0]
    _, code = run_and_get_code(lambda: loss_of(x, y).backward())
    binding = LAST_BINDING[0]
    table = binding[0].table
    resolved: set[int] = set()
    for module in code:
        found = objects_resolved(module)
        assert found is not None, "every sync is a method of a resolved object"
        resolved |= found
    requested = {e.index for e in table.entries if e.kind is EntryKind.REQUESTED}
    left_out = requested - resolved
    assert left_out, "the demo's backward leaves waits out: some events serve none"
    assert table.plan.loaded & requested == requested & resolved
    assert all(binding[1 + i] is None for i in left_out), "the call builds none of them"
    assert all(isinstance(binding[1 + i], torch.Event) for i in requested & resolved)


def test_code_with_a_sync_left_as_an_op_call_may_read_any_object() -> None:
    """What generated code resolves: its lookup lines and Inductor's stream definitions; an
    op call resolves objects by indices the code does not name, so any may be read."""
    code = "user_object3, user_object4, = lookup_user_objects((3, 4,))\n"
    stream = "    stream1 = get_external_object_by_index(7)\n"
    assert objects_resolved(code + stream) == {3, 4, 7}
    assert objects_resolved(code + "torch.ops.streams.record_event.default(9, 3)\n") is None


def test_a_syncs_arguments_read_as_inductor_writes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sync_in`` reads a sync's arguments without Inductor's ``codegen_args`` (which
    defines a class on each call): on every sync line of the demo's step, what it reads is
    what Inductor writes, a deallocation sync's buffer operand included."""
    read: list[tuple[list[str], list[str]]] = []
    ours = sync_lines._arguments

    def compared(node: Any) -> tuple[list[str], bool]:
        args, has_kwargs = ours(node)
        read.append((args, [str(arg) for arg in node.codegen_args()]))
        return args, has_kwargs

    monkeypatch.setattr(sync_lines, "_arguments", compared)
    training_step(monkeypatch, judged=True)
    assert read, "the step's code has sync lines"
    assert all(args == inductors for args, inductors in read), read
    assert any(not arg.isdigit() for args, _ in read for arg in args), "a buffer operand"
