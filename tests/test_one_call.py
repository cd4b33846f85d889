"""``userstreams`` compiles a graph with streams as one Inductor call on every torch
(``options={"userstreams.one_call": False}`` asks for regions instead).

Inductor 2.12+ runs each node of a graph on its own stream; on 2.11 the package places
them (``inductor.placed_streams``). The backend hands Inductor the whole graph, syncs in place;
while installed, Inductor's scheduler keeps every sync where the graph put it
(``inductor.sync_order``) and its code resolves the call's objects once
(``inductor.launch_code``). Judged as on a GPU: the fake accelerator with GPU semantics
and the run-time race detector, which sees each C++ kernel of the call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from test_races import TORCH
from test_sync_only_graphs import sync_between_compute
from torch._inductor.utils import run_and_get_code

import torch_userstreams
from torch_userstreams.backends import inductor_graphs
from torch_userstreams.backends.inductor_graphs import inductor_runs_streams
from torch_userstreams.backends.inductor_options import ONE_CALL_OPTION, package_options
from torch_userstreams.errors import UnsupportedPathError
from torch_userstreams.inductor import placed_streams, sync_order
from torch_userstreams.inductor.launch_code import LOOKUP
from torch_userstreams.originals import shadowed
from torch_userstreams.testing.capture import no_compile_caches
from torch_userstreams.testing.fake_accelerator import (
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)
from torch_userstreams.testing.races import RaceReport, detect_races


def test_a_sync_stays_between_the_work_around_it() -> None:
    """Each sync follows what came before it since the last sync, and that sync; other
    work follows the last sync before it. Buffers name the ordering (a sync's is empty)."""
    operations = [
        ("op0", ["buf0"], False),
        ("op1", ["buf1"], True),
        ("op2", ["buf2"], False),
        ("op3", [], False),
        ("op4", ["buf4"], True),
        ("op5", ["buf5"], True),
        ("op6", ["buf6", "buf7"], False),
    ]
    assert sync_order.fences(operations) == {
        "op1": ["buf0"],
        "op2": ["buf1"],
        "op3": ["buf1"],
        "op4": ["buf2", "buf1"],
        "op5": ["buf4"],
        "op6": ["buf5"],
    }
    assert sync_order.fences([("op0", ["buf0"], False)]) == {}


@pytest.fixture
def gpu_like() -> Iterator[None]:
    torch_userstreams.install()
    try:
        with fake_accelerator(gpu_semantics=True), no_compile_caches():
            yield
    finally:
        torch_userstreams.uninstall()
        torch._dynamo.reset()


def two_side_streams(x, w, s0, s1, forked, joined0, joined1):  # type: ignore[no-untyped-def]
    """Two side streams forked from and joined to the current stream, each with a random op
    (Inductor seeds them from one tensor it makes) and a product the backward sums."""
    current = torch.accelerator.current_stream()
    forked.record(current)
    forked.wait(s0)
    forked.wait(s1)
    with s0:
        a = torch.nn.functional.dropout(w * 2, 0.5) + x
    with s1:
        b = torch.nn.functional.dropout(x * 3, 0.5) * w
    joined0.record(s0)
    joined0.wait(current)
    joined1.record(s1)
    joined1.wait(current)
    return a, b


ONE_CALL = {"userstreams.one_call": True}
# What one call's code starts with: the call's objects, resolved once (``inductor.launch_code``).
ONE_CALL_CODE = f"= {LOOKUP}(("
# A side stream's block: Inductor's own names it ``streamN`` (2.12+), the package's the
# stream's object (2.11, ``inductor.placed_streams``).
SIDE_BLOCK = re.compile(r"\n +with (stream[1-9]\d*|user_object\d+):\n")


def enters_a_side_stream(module: str) -> bool:
    return SIDE_BLOCK.search(module) is not None


def run_with_backward(
    backend: str, options: dict[str, Any] | None = None
) -> tuple[RaceReport, list[str]]:
    compiled = torch.compile(two_side_streams, backend=backend, options=options)
    x = torch.randn(64, requires_grad=True)
    w = torch.randn(64, requires_grad=True)
    events = [FakeAcceleratorEvent() for _ in range(3)]
    objects = (FakeAcceleratorStream(), FakeAcceleratorStream(), *events)

    def step() -> None:
        a, b = compiled(x, w, *objects)
        (a.sum() + b.sum()).backward()

    with detect_races() as report:
        _, code = run_and_get_code(step)
    return report, code


@pytest.mark.usefixtures("gpu_like")
def test_forward_and_backward_are_one_call_each_and_race_free() -> None:
    report, code = run_with_backward("userstreams", ONE_CALL)
    assert len(code) == 2, "one compiled call for the forward, one for the backward"
    for module in code:
        assert ONE_CALL_CODE in module and enters_a_side_stream(module), module
    assert report, report


@pytest.mark.usefixtures("gpu_like")
def test_one_call_by_default_regions_on_request() -> None:
    report, code = run_with_backward("userstreams")
    assert len(code) == 2 and all(map(enters_a_side_stream, code)), code
    assert report, report
    report, code = run_with_backward("userstreams", {ONE_CALL_OPTION: False})
    assert len(code) > 2, "a compiled call per region"
    assert not any(ONE_CALL_CODE in module for module in code)
    assert report, report


@pytest.mark.usefixtures("gpu_like")
@pytest.mark.parametrize(
    "switched_off",
    [
        pytest.param(
            "fences",
            marks=pytest.mark.skipif(
                TORCH >= (2, 14),
                reason="Inductor 2.14+ orders the readers of what a sync passes through, "
                "all this program's work after a wait (test_work_on_either_side_of_a_sync_is_"
                "never_one_kernel needs the package's ordering on every release)",
            ),
        ),
        "factories",
    ],
)
def test_each_part_of_the_one_call_path_is_needed(
    switched_off: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the fences, Inductor 2.12-2.13 moved a side stream's backward kernel above the
    wait that orders it after the incoming gradient; without placing the seeds on their
    readers' stream, the random ops read seeds another stream made."""
    off: dict[str, tuple[Any, str, Callable[..., Any]]] = {
        "fences": (sync_order, "fences", lambda operations: {}),
        "factories": (inductor_graphs, "factories_on_their_readers_stream", lambda gm: None),
    }
    module, name, replacement = off[switched_off]
    monkeypatch.setattr(module, name, replacement)
    report, _ = run_with_backward("userstreams", ONE_CALL)
    assert not report, f"switching off {switched_off} went unseen"


@pytest.mark.usefixtures("gpu_like")
@pytest.mark.parametrize("flushed", [True, False])
def test_work_on_either_side_of_a_sync_is_never_one_kernel(
    flushed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``x * 3`` before a record and its ``.cos()`` after a wait: Inductor's C++ backend
    gathered them into one kernel, called after the wait, and freed ``x`` before it
    (``UnboundLocalError``). Each sync now flushes the kernel gathered before it. (The
    backend would move ``.cos()`` up to ``x * 3``, before the syncs, as it reads nothing
    they order: kept in place here, so that Inductor meets the sync between the two.)"""
    monkeypatch.setattr(inductor_graphs, "computed_early", lambda gm: [])
    if not flushed:
        monkeypatch.setattr(sync_order, "flushed_at_syncs", lambda *_: nullcontext())
    compiled = torch.compile(sync_between_compute, backend="userstreams", options=ONE_CALL)
    x, event, main = torch.randn(5), FakeAcceleratorEvent(), torch.accelerator.current_stream()
    if not flushed:
        with pytest.raises(UnboundLocalError):
            compiled(x, event, FakeAcceleratorStream(), main)
        return
    out, [code] = run_and_get_code(compiled, x, event, FakeAcceleratorStream(), main)
    torch.testing.assert_close(out, (x * 3).cos())
    call = code[code.index("def call") :]
    parts = ("cpp_fused_mul_0(", "record", "wait", "cpp_fused_cos_1(")
    order = [call.index(part) for part in parts]
    assert order == sorted(order), call


@pytest.mark.usefixtures("gpu_like")
def test_a_data_dependent_size_falls_back_to_regions() -> None:
    """Inductor fails on a data-dependent size a sync passes through (``u3 -> u0``)."""
    from test_accelerator_regions import positives_on_side_stream

    x = torch.tensor([1.0, -2.0, 3.0, -4.0, 5.0])
    compiled = torch.compile(positives_on_side_stream, backend="userstreams", options=ONE_CALL)
    main = torch.accelerator.current_stream()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        got, code = run_and_get_code(
            compiled, x, FakeAcceleratorStream(), FakeAcceleratorEvent(), main
        )
    torch.testing.assert_close(got, torch.tensor([2.0, 6.0, 10.0]))
    assert not any(ONE_CALL_CODE in module for module in code), code


def _clone_between_streams_raced() -> tuple[RaceReport, str]:
    """``made`` on s0, cloned on s2 and read there (``no_op_between_streams``), compiled with
    ``userstreams`` and run under the race detector; values checked against eager."""
    from test_accelerator_regions import no_op_between_streams

    program = no_op_between_streams(torch.clone, read_on_third=False)
    x = torch.randn(4, 6)
    streams = [FakeAcceleratorStream() for _ in range(3)]
    compiled = torch.compile(program, backend="userstreams")
    with detect_races() as report:
        (out,), [code] = run_and_get_code(compiled, x, *streams)
    torch.testing.assert_close(out, program(x, *streams)[0])
    return report, code


@pytest.mark.usefixtures("gpu_like")
@pytest.mark.parametrize(
    ("pinned", "after_inductor", "race_free"),
    [(True, True, True), (False, True, True), (True, False, True), (False, False, False)],
    ids=["both", "after-inductor-alone", "pinned-alone", "neither"],
)
def test_a_read_stays_before_the_sync_that_frees_its_buffer(
    pinned: bool, after_inductor: bool, race_free: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``made`` on s0 is read on s2 through a clone Inductor removes; the backend re-syncs
    its memory after that last read. Inductor's post-grad passes moved the read, computed
    in a later kernel, past an unpinned record: s0 could reuse ``made`` while s2 still
    read it. Each guard alone keeps the read before the record: the record pinned after
    the read (``control_deps``; on 2.11, every value computed before each sync), or the
    re-sync after Inductor's passes."""
    from torch_userstreams.inductor import reuse_syncs

    if not pinned:
        monkeypatch.setattr(reuse_syncs, "PINNED_PASS", reuse_syncs.PASS)
        # 2.11 has no control_deps to pin with: its Inductor computes every value read
        # after a sync before it instead.
        monkeypatch.setattr(
            placed_streams, "_realize_what_later_nodes_read", lambda env, settled: None
        )
    if not after_inductor:
        monkeypatch.setattr(reuse_syncs, "resync_after_post_grad", lambda gm, table, user: user)
    report, code = _clone_between_streams_raced()
    assert ONE_CALL_CODE in code, "one call"
    # 2.11 has no control_deps to pin with: there the guard is that every value read after
    # a sync is computed before it (monkeypatched away with ``pinned``).
    assert bool(report) is (race_free if inductor_runs_streams() else pinned), report


def kernels_by_block(code: str) -> list[tuple[str | None, list[str]]]:
    """Each C++ kernel the ``call`` in ``code`` launches, as the block it is called in (None:
    outside any stream block) and its arguments."""
    call = code[code.index("def call") :]
    found: list[tuple[str | None, list[str]]] = []
    blocks: list[tuple[int, str]] = []  # (indent, name) of the blocks open
    for line in call.splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        if not line.strip():
            continue
        if indent <= 4:
            break  # the end of ``call``
        blocks = [(at, name) for at, name in blocks if at < indent]
        block = re.fullmatch(r"with (\w+):", line.strip())
        kernel = re.fullmatch(r"cpp_fused_\w+\((.*)\)", line.strip())
        if block:
            blocks.append((indent, block.group(1)))
        elif kernel:
            found.append((blocks[-1][1] if blocks else None, kernel.group(1).split(", ")))
    return found


@pytest.mark.usefixtures("gpu_like")
@pytest.mark.parametrize("computed_before_syncs", [True, False])
def test_work_before_a_sync_runs_on_its_own_stream(
    computed_before_syncs: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``made = x * x`` in s0's block, read on s2 after s2 waits for s0: its kernel runs in
    s0's block, before the wait. Inductor computes a pointwise value where it is read, and
    writes a sync when it lowers it; 2.12+ computes what a sync is wrapped to follow before
    it, 2.11 (while installed) every value read after a sync. Without that, 2.11 called s0's
    kernel after the wait meant to follow it."""
    if not computed_before_syncs:
        if inductor_runs_streams():
            pytest.skip("2.12+ computes it through control_deps, which the package keeps")
        monkeypatch.setattr(
            placed_streams, "_realize_what_later_nodes_read", lambda env, settled: None
        )
    report, code = _clone_between_streams_raced()
    assert bool(report) is computed_before_syncs, report
    (s0, made), *later = kernels_by_block(code)
    s2 = {block for block, _ in later}
    assert s0 is not None and len(s2) == 1 and s0 not in s2 and None not in s2, code
    assert made[-1] in {arg for _, args in later for arg in args}, code  # s2 reads it


def several_outputs_read_on_a_side_stream(
    reads: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> Callable[..., torch.Tensor]:
    """``made`` on s0, then read on s1 by an op with two outputs, through a clone."""

    def program(x: torch.Tensor, s0: torch.Stream, s1: torch.Stream) -> torch.Tensor:
        main = torch.accelerator.current_stream()
        s0.wait_stream(main)
        s1.wait_stream(main)
        with s0:
            made = x * x
        s1.wait_stream(s0)
        with s1:
            values, indices = reads(made.clone())
            out = (values + 1) * 2 + indices.float()
        main.wait_stream(s1)
        return out

    return program


@pytest.mark.usefixtures("gpu_like")
@pytest.mark.parametrize(
    "reads",
    [lambda t: torch.max(t, dim=1), lambda t: torch.sort(t, dim=1)],
    ids=["max", "sort"],
)
def test_a_read_with_several_outputs_stays_before_the_sync_that_frees_its_buffer(
    reads: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """The re-sync after the last read pins its record on the read's parts: Inductor 2.12
    realises no tuple a ``control_deps`` depends on, and computed ``max`` after the record
    (its kernel read ``made`` while s0 could reuse it)."""
    program = several_outputs_read_on_a_side_stream(reads)
    x = torch.randn(4, 6)
    streams = (FakeAcceleratorStream(), FakeAcceleratorStream())
    compiled = torch.compile(program, backend="userstreams")
    with detect_races() as report:
        out, [code] = run_and_get_code(compiled, x, *streams)
    torch.testing.assert_close(out, program(x, *streams))
    assert ONE_CALL_CODE in code, "one call"
    assert report, report


@pytest.mark.usefixtures("gpu_like")
def test_a_view_updated_on_a_side_stream_is_one_call_with_static_sizes() -> None:
    """The regions fallback for a folded view-scatter is for symbolic sizes alone
    (``test_accelerator_regions::test_an_aliased_input_updated_with_symbolic_sizes_compiles``)."""
    from test_accelerator_regions import update_a_base_read_its_view

    compiled = torch.compile(update_a_base_read_its_view, backend="userstreams", dynamic=False)
    main = torch.accelerator.current_stream()
    a, expected_a = torch.arange(6.0), torch.arange(6.0)
    expected = update_a_base_read_its_view(
        expected_a, expected_a[1:], FakeAcceleratorStream(), main
    )
    got, [code] = run_and_get_code(compiled, a, a[1:], FakeAcceleratorStream(), main)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(a, expected_a)
    assert ONE_CALL_CODE in code, code


def test_the_one_call_option_takes_a_bool() -> None:
    assert package_options({ONE_CALL_OPTION: True, "max_autotune": False}) == (
        True,
        {"max_autotune": False},
    )
    assert package_options(None) == (True, None)
    assert package_options({ONE_CALL_OPTION: False}) == (False, {})
    refused = re.escape("'userstreams.one_call' is True or False")
    with pytest.raises(UnsupportedPathError, match=refused):
        package_options({ONE_CALL_OPTION: "yes"})


def test_a_shadowed_attribute_is_restored_as_it_was() -> None:
    """How the codegen patches shadow a scheduler's methods for one graph's code."""

    class Owner:
        def method(self) -> str:
            return "class"

    owner = Owner()
    owner.attribute = "instance"  # type: ignore[attr-defined]
    with shadowed(owner, {"method": lambda: "shadow", "attribute": "shadow"}):
        assert owner.method() == "shadow" and owner.attribute == "shadow"  # type: ignore[attr-defined]
    assert owner.method() == "class" and "method" not in vars(owner)
    assert owner.attribute == "instance"  # type: ignore[attr-defined]


def side_then_joined(
    x: torch.Tensor, w: torch.Tensor, s: torch.Stream, done: torch.Event
) -> torch.Tensor:
    with s:
        y = (x * w).sin()
        done.record(s)
    done.wait()
    return (y * w).sum()


def _leaves_and_eager_grads(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Two leaves, and their gradients from ``side_then_joined`` run eagerly on simulated
    objects (native CPU events cannot record); the leaves' own gradients are left unset."""
    from torch_userstreams.simulator import SimEvent, SimStream

    gen = torch.Generator().manual_seed(seed)
    leaves = [torch.randn(8, generator=gen, requires_grad=True) for _ in range(2)]
    side_then_joined(*leaves, SimStream(device="cpu"), SimEvent(device="cpu")).backward()
    expected = [leaf.grad for leaf in leaves]
    for leaf in leaves:
        leaf.grad = None
    return leaves, expected  # type: ignore[return-value]


class _Entered:
    """An observer that keeps the streams simulated code enters, in order."""

    def __init__(self) -> None:
        self.streams: list[torch.Stream] = []

    def enter(self, stream: torch.Stream) -> None:
        self.streams.append(stream)

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args: None  # every other event the observer is told of


@pytest.mark.parametrize("one_call", [True, False], ids=["default", "regions"])
def test_a_cpu_graph_is_one_call_on_its_streams_without_syncs(one_call: bool) -> None:
    """On CPU the backend takes the accelerator's path: one call per graph, each node in its
    stream's block (the call's own stream, forward and backward), its syncs left out: every
    op runs on the host in program order, and native CPU events cannot record. Regions
    (asked for) compile CPU graphs without streams. Gradients are eager's either way."""
    from torch_userstreams.observe import watching
    from torch_userstreams.simulator import SimEvent, SimStream

    options = None if one_call else {ONE_CALL_OPTION: False}
    leaves, expected = _leaves_and_eager_grads(seed=3)
    compiled = torch.compile(side_then_joined, backend="userstreams", options=options)
    s, done = SimStream(device="cpu"), SimEvent(device="cpu")
    with torch_userstreams.installed(), no_compile_caches(), watching(_Entered()) as entered:
        _, code = run_and_get_code(lambda: compiled(*leaves, s, done).backward())
    torch._dynamo.reset()
    torch.testing.assert_close([leaf.grad for leaf in leaves], expected)
    assert len(code) == 2, "one compiled call for the forward, one for the backward"
    for module in code:
        assert enters_a_side_stream(module) is one_call, module
        assert not re.search(r"user_object\d+\.\w+\(|streams\.\w+\.default\(", module), module
    assert not done.log, "no sync is issued on CPU"
    assert entered.streams == ([s, s] if one_call else []), entered.streams


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({"cpp_wrapper": True}, id="cpp-wrapper"),
        pytest.param(
            {"triton.cudagraphs": True, "triton.cudagraph_or_error": True}, id="cudagraphs"
        ),
    ],
)
def test_a_cpu_graph_compiles_under_the_options_of_the_path_it_left(
    options: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A CPU graph compiled without streams took ``cpp_wrapper`` and CUDA graphs as any
    Inductor graph: under the C++ wrapper, which the package writes no stream block into,
    it still does; CUDA graphs capture nothing on CPU, so nothing is skipped or refused."""
    from torch_userstreams.simulator import SimEvent, SimStream

    leaves, expected = _leaves_and_eager_grads(seed=5)
    compiled = torch.compile(side_then_joined, backend="userstreams", options=options)
    with torch_userstreams.installed(), no_compile_caches():
        compiled(*leaves, SimStream(device="cpu"), SimEvent(device="cpu")).backward()
    torch._dynamo.reset()
    torch.testing.assert_close([leaf.grad for leaf in leaves], expected)
    assert "skipping cudagraphs" not in caplog.text
