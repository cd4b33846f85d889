"""The race detector sees Inductor's compiled code kernel by kernel.

Native Inductor 2.12+ compiles a graph with several streams into one call that enters each
stream block inside it, so counting the call as one kernel on one stream would hide every
race between its kernels. ``testing.compiled_kernels`` watches each C++ kernel of the
generated module instead (what it reads and writes, from the ``const`` in its definition).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pass_programs import simulated_eager
from test_races import TORCH, gpu, joined, run_steps, unjoined

from torch_userstreams.inductor import sync_order
from torch_userstreams.observe import outputs_escape, part_of_a_program, watching
from torch_userstreams.simulator import SimStream
from torch_userstreams.testing.capture import no_compile_caches
from torch_userstreams.testing.compiled_kernels import KernelView, written_arguments
from torch_userstreams.testing.fake_accelerator import FakeAcceleratorStream
from torch_userstreams.testing.hazards import HazardKind

__all__ = ["gpu"]  # the fixture, used by name

SOURCE = """
cpp_fused_add_0 = async_compile.cpp_pybinding(['const float*', 'float*', 'const int64_t'], r'''
extern "C" void kernel(const float* in_ptr0, float* out_ptr0, const int64_t ks0) {}
''')
cpp_fused_mul_1 = async_compile.cpp_pybinding(['float*'], r'''...''')

def call(args):
    a, b = args
    cpp_fused_add_0(a, b, 4)
    cpp_fused_mul_1(b)
    return (b,)
"""


def test_each_kernels_accesses_come_from_its_definition() -> None:
    assert written_arguments(SOURCE) == {
        "cpp_fused_add_0": (False, True, None),
        "cpp_fused_mul_1": (True,),
    }


class Told:
    """An observer that keeps the kernels and escapes it is told of."""

    def __init__(self) -> None:
        self.kernels: list[tuple[str, list[int], list[int]]] = []

    def kernel(self, name: str, reads: Sequence[torch.Tensor], writes: Sequence[torch.Tensor]):
        self.kernels.append((name, [id(t) for t in reads], [id(t) for t in writes]))

    def __getattr__(self, name: str) -> Any:
        return lambda *args: None


def generated_module() -> tuple[dict[str, Any], Any]:
    calls: list[str] = []
    namespace: dict[str, Any] = {
        "async_compile": None,
        "cpp_fused_add_0": lambda *args: calls.append("add"),
        "cpp_fused_mul_1": lambda *args: calls.append("mul"),
    }
    exec(compile(SOURCE[SOURCE.index("def call") :], "<generated>", "exec"), namespace)
    namespace["calls"] = calls
    return namespace, SimpleNamespace(current_callable=namespace["call"], source_code=SOURCE)


def test_a_watched_module_tells_each_kernel_and_is_restored() -> None:
    namespace, compiled = generated_module()
    natives = {name: namespace[name] for name in ("cpp_fused_add_0", "cpp_fused_mul_1")}
    a, b = torch.ones(2), torch.zeros(2)
    view, told = KernelView(), Told()
    assert view.watch(compiled) and view.watch(compiled)  # the second time: already watched
    namespace["call"]([a, b])  # nobody watches: the kernels run, nothing is told
    with watching(told):  # type: ignore[arg-type]
        namespace["call"]([a, b])
    assert told.kernels == [
        ("cpp_fused_add_0", [id(a)], [id(b)]),
        ("cpp_fused_mul_1", [], [id(b)]),
    ]
    assert namespace["calls"] == ["add", "mul", "add", "mul"]
    view.restore()
    assert {name: namespace[name] for name in natives} == natives


def test_code_it_cannot_see_into_is_one_kernel() -> None:
    """Not seen kernel by kernel: a call that is no function of the module, a call torch
    wrapped in its own code (whose globals are not the module's), a module that defines a
    GPU kernel, one that lacks a kernel its source defines."""
    namespace, compiled = generated_module()
    call = namespace["call"]
    unseen = [
        SimpleNamespace(current_callable=object(), source_code=SOURCE),
        SimpleNamespace(current_callable=lambda args: call(args), source_code=SOURCE),
        SimpleNamespace(
            current_callable=call,
            source_code=SOURCE + "triton_poi_0 = async_compile.triton('triton_poi_0', '')\n",
        ),
    ]
    assert not any(KernelView().watch(c) for c in unseen)
    del namespace["cpp_fused_mul_1"]
    view = KernelView()
    assert not view.watch(compiled)
    view.restore()


def test_a_kernel_called_otherwise_than_defined_writes_every_tensor() -> None:
    namespace, compiled = generated_module()
    view, told = KernelView(), Told()
    view.watch(compiled)
    a, b = torch.ones(2), torch.zeros(2)
    with watching(told):  # type: ignore[arg-type]
        namespace["cpp_fused_add_0"](a, b)  # two arguments where three are defined
    view.restore()
    assert told.kernels == [("cpp_fused_add_0", [], [id(a), id(b)])]


def test_nested_blocks_wrap_each_kernel_once() -> None:
    namespace, compiled = generated_module()
    outer, inner = KernelView(), KernelView()
    outer.watch(compiled)
    wrapped = namespace["cpp_fused_add_0"]
    inner.watch(compiled)
    assert namespace["cpp_fused_add_0"] is wrapped
    inner.restore()
    assert namespace["cpp_fused_add_0"] is wrapped
    outer.restore()
    assert namespace["cpp_fused_add_0"] is not wrapped


def test_a_region_of_a_program_keeps_its_outputs() -> None:
    region, graph = SimpleNamespace(), SimpleNamespace()
    part_of_a_program(region)
    part_of_a_program(len)  # a builtin refuses the mark: nothing to say of it
    assert not outputs_escape(region) and outputs_escape(graph)


native_one_call = pytest.mark.skipif(
    TORCH < (2, 12), reason="Inductor 2.11 runs every kernel of a graph on one stream"
)


@pytest.mark.usefixtures("installed")
@native_one_call
def test_a_race_between_two_kernels_of_one_native_call_is_found(
    gpu: FakeAcceleratorStream,
) -> None:
    """``unjoined`` compiled by native Inductor: one call runs ``relu`` on the side stream
    and the C++ kernel that sums its result on main, with no sync between them. Counted as
    one kernel, the call hid it."""
    report = run_steps(unjoined, "inductor", gpu)
    assert any(
        f.first.startswith("cpp_fused_relu_0 (graph unjoined")
        and f.second.startswith("cpp_fused_sum_1 (graph unjoined")
        and f.second_stream == id(gpu)
        and f.first_stream != id(gpu)
        for f in report.findings
    ), str(report)


@pytest.mark.usefixtures("installed")
@native_one_call
def test_native_inductor_orders_a_backward_kernel_after_its_entry_wait(
    gpu: FakeAcceleratorStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by this view: in ``joined``'s backward the side stream must wait for the
    gradient main made before it reads it. Inductor 2.12 and 2.13 order no later reader
    after a ``wait_event`` (2.13 orders them after a ``wait_stream`` only), so they fuse
    the kernel that reads the gradient with one that runs before the wait, and the call
    issues the wait after that kernel: one race per step. While installed, Inductor keeps
    every sync between the work around it (``inductor.sync_order``) and the call is
    race-free on every release; without that, 2.12 and 2.13 race as found."""
    with no_compile_caches():
        report = run_steps(joined, "inductor", gpu)
        assert report, str(report)
        assert report.kernels > 10, str(report)
        if TORCH >= (2, 14):
            return
        torch._dynamo.reset()
        monkeypatch.setattr(sync_order, "fences", lambda operations: {})
        report = run_steps(joined, "inductor", gpu)
    found = {(f.kind, f.first.split(" (")[0], f.second.split(" (")[0]) for f in report.findings}
    expected = {(HazardKind.RAW, "ones_like", "cpp_fused_expand_threshold_backward_0")}
    assert found == expected and len(report.findings) == 2, str(report)


def two_sides(w: torch.Tensor, s0: torch.Stream, s1: torch.Stream) -> tuple[torch.Tensor, ...]:
    with s0:
        a = w.sin()
    with s1:
        b = w * 0.5
    return a, b


def kernel_blocks(code: str) -> dict[str, str]:
    """Each C++ kernel the generated ``call`` runs, with the stream block it runs in."""
    blocks: dict[str, str] = {}
    block, depth = "", 0
    for line in code[code.index("def call") :].splitlines():
        indent = len(line) - len(line.lstrip())
        if block and line.strip() and indent <= depth:
            block = ""  # the block ended
        entered = re.match(r"(\s+)with (\w+):$", line)
        if entered:
            block, depth = entered.group(2), len(entered.group(1))
        called = re.match(r"\s+(cpp_fused_\w+)\(", line)
        if called:
            blocks[called.group(1)] = block
    return blocks


@pytest.mark.usefixtures("installed")
@native_one_call
@no_compile_caches()  # Inductor's cache keys native code by the graph, not by our codegen
def test_nodes_of_two_streams_never_share_a_cpp_kernel() -> None:
    """Inductor's C++ backend writes a kernel's call when it is flushed, and Inductor changed
    stream blocks without flushing it: ``w.sin()`` on one stream and ``w * 0.5`` on another
    became ``cpp_fused_mul_sin_0``, run on one of them (``inductor.launch_code``)."""
    from torch._inductor.utils import run_and_get_code

    w, s0, s1 = torch.rand(4), SimStream(device="cpu"), SimStream(device="cpu")
    with simulated_eager():
        expected = two_sides(w, s0, s1)
    out, code = run_and_get_code(torch.compile(two_sides, backend="inductor"), w, s0, s1)
    torch.testing.assert_close(out, expected)
    blocks = kernel_blocks(code[0])
    by_op = {name.split("_")[2]: block for name, block in blocks.items()}
    assert set(by_op) == {"sin", "mul"} and len(blocks) == 2, code[0]
    # Each in a block of its own stream: sin's on s0, mul's on s1.
    defined = dict(re.findall(r"^ +(stream\d+) = (user_object\d+)$", code[0], re.M))
    [(names, indices)] = re.findall(r"^ +(.+), = lookup_user_objects\(\((.+),\)\)$", code[0], re.M)
    resolved = dict(zip(names.split(", "), indices.split(", "), strict=True))
    index = {by_op[op]: int(resolved[defined[by_op[op]]]) for op in by_op}
    assert index[by_op["sin"]] != index[by_op["mul"]], code[0]
    assert index[by_op["sin"]] < index[by_op["mul"]], code[0]  # s0 was met first
