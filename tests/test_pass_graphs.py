"""The package's backward passes on eight stream programs: graphs, gradients, bindings.

Graphs are frozen as inline expectations (``graph_text.render``: each node with its stream
and the pass that added it). Regenerate with ``EXPECTTEST_ACCEPT=1`` and review the diff.
"""

from __future__ import annotations

import unittest

import expecttest
import pytest
import torch
from graph_text import capture_aot
from helpers import backward_events, last_binding
from pass_programs import PROGRAMS, WRAPS_SYNCS, clone, eager_reference, inputs, simulated_eager

import torch_userstreams


class TestPassGraphs(expecttest.TestCase):
    def setUp(self) -> None:
        torch_userstreams.install()

    def tearDown(self) -> None:
        torch_userstreams.uninstall()
        torch._dynamo.reset()

    def graphs(self, name: str) -> str:
        args = inputs(name)
        forward, backward, out = capture_aot(PROGRAMS[name], *clone(args))
        out.backward()
        return "forward:\n" + "\n".join(forward) + "\nbackward:\n" + "\n".join(backward)

    def test_two_local_streams(self) -> None:
        self.assertExpectedInline(
            self.graphs("two_local_streams"),
            """\
forward:
input primals_1
input primals_2
mul = mul.Tensor(primals_1, primals_2)  @stream 0
sin = sin(mul)  @stream 1
add = add.Tensor(mul, sin)
streams.record_event(10, 3)  # dealloc_syncs
streams.sync_dealloc(10, 1, sin)  # dealloc_syncs
sum_1 = sum(add)
return [sum_1, primals_1, primals_2, mul]
backward:
input primals_1
input primals_2
input mul
input tangents_1
expand = expand(tangents_1, [4])
streams.record_event(2, 3)  # backward_syncs
cos = cos(mul)  @stream 1
streams.record_event(9, 1)  # dealloc_syncs
streams.sync_dealloc(9, 0, mul)  # dealloc_syncs
streams.wait_event(2, 1)  # backward_syncs
mul_1 = mul.Tensor(expand, cos)  @stream 1
streams.record_event(7, 1)  # dealloc_syncs
streams.sync_dealloc(7, 3, expand)  # dealloc_syncs
streams.record_event(4, 1)  # backward_syncs
streams.wait_event(2, 0)  # backward_syncs
streams.wait_event(4, 0)  # backward_syncs
add_1 = add.Tensor(expand, mul_1)  @stream 0  # grad_accumulation
streams.record_event(11, 0)  # dealloc_syncs
streams.sync_dealloc(11, 1, mul_1)  # dealloc_syncs
streams.record_event(8, 0)  # dealloc_syncs
streams.sync_dealloc(8, 3, expand)  # dealloc_syncs
mul_2 = mul.Tensor(add_1, primals_1)  @stream 0
streams.record_event(6, 0)  # backward_syncs
mul_3 = mul.Tensor(add_1, primals_2)  @stream 0
streams.record_event(5, 0)  # backward_syncs
streams.wait_event(5, 3)  # backward_syncs
streams.wait_event(6, 3)  # backward_syncs
return [mul_3, mul_2]""",
        )

    def test_nested_contexts(self) -> None:
        self.assertExpectedInline(
            self.graphs("nested_contexts"),
            """\
forward:
input primals_1
input primals_2
mul = mul.Tensor(primals_1, primals_2)  @stream 0
exp = exp(mul)  @stream 1
streams.record_event(9, 1)  # dealloc_syncs
streams.sync_dealloc(9, 0, mul)  # dealloc_syncs
mul_1 = mul.Tensor(exp, primals_2)  @stream 0
sum_1 = sum(mul_1)
streams.record_event(11, 3)  # dealloc_syncs
streams.sync_dealloc(11, 0, mul_1)  # dealloc_syncs
return [sum_1, primals_1, primals_2, exp]
backward:
input primals_1
input primals_2
input exp
input tangents_1
expand = expand(tangents_1, [4])
streams.record_event(2, 3)  # backward_syncs
streams.wait_event(2, 0)  # backward_syncs
mul_2 = mul.Tensor(expand, exp)  @stream 0
streams.record_event(10, 0)  # dealloc_syncs
streams.sync_dealloc(10, 1, exp)  # dealloc_syncs
mul_3 = mul.Tensor(expand, primals_2)  @stream 0
streams.record_event(8, 0)  # dealloc_syncs
streams.sync_dealloc(8, 3, expand)  # dealloc_syncs
streams.record_event(4, 0)  # backward_syncs
detach = detach(exp)  @stream 1
detach_1 = detach(detach)  @stream 1
streams.wait_event(4, 1)  # backward_syncs
mul_4 = mul.Tensor(mul_3, detach_1)  @stream 1
streams.record_event(12, 1)  # dealloc_syncs
streams.sync_dealloc(12, 0, mul_3)  # dealloc_syncs
streams.record_event(5, 1)  # backward_syncs
streams.wait_event(5, 0)  # backward_syncs
mul_5 = mul.Tensor(mul_4, primals_1)  @stream 0
mul_6 = mul.Tensor(mul_4, primals_2)  @stream 0
streams.record_event(13, 0)  # dealloc_syncs
streams.sync_dealloc(13, 1, mul_4)  # dealloc_syncs
streams.record_event(6, 0)  # backward_syncs
add = add.Tensor(mul_2, mul_5)  @stream 0  # grad_accumulation
streams.record_event(7, 0)  # backward_syncs
streams.wait_event(6, 3)  # backward_syncs
streams.wait_event(7, 3)  # backward_syncs
return [mul_6, add]""",
        )

    def test_inplace_on_input(self) -> None:
        self.assertExpectedInline(
            self.graphs("inplace_on_input"),
            """\
forward:
input primals_1
input primals_2
input primals_3
add = add.Tensor(primals_1, 1)  @stream 0
copy_ = copy_(primals_1, add)  @stream 0  # write_backs
mul = mul.Tensor(primals_2, add)  @stream 0
mul_1 = mul.Tensor(mul, primals_3)  @stream 0
sum_1 = sum(mul_1)
streams.record_event(6, 2)  # dealloc_syncs
streams.sync_dealloc(6, 0, mul_1)  # dealloc_syncs
return [sum_1, primals_2, primals_3, add]
backward:
input primals_2
input primals_3
input add
input tangents_1
expand = expand(tangents_1, [4])
streams.record_event(1, 2)  # backward_syncs
streams.wait_event(1, 0)  # backward_syncs
mul = mul.Tensor(primals_2, add)  @stream 0
mul_2 = mul.Tensor(expand, mul)  @stream 0
streams.record_event(4, 0)  # backward_syncs
mul_3 = mul.Tensor(expand, primals_3)  @stream 0
streams.record_event(5, 0)  # dealloc_syncs
streams.sync_dealloc(5, 2, expand)  # dealloc_syncs
mul_4 = mul.Tensor(mul_3, add)  @stream 0
streams.record_event(3, 0)  # backward_syncs
streams.wait_event(3, 2)  # backward_syncs
streams.wait_event(4, 2)  # backward_syncs
return [None, mul_4, mul_2]""",
        )

    @unittest.skipUnless(WRAPS_SYNCS, "without control_deps, torch names the saved value 'mul'")
    def test_record_wait_across_streams(self) -> None:
        self.assertExpectedInline(
            self.graphs("record_wait_across_streams"),
            """\
forward:
input primals_1
input primals_2
mul = mul.Tensor(primals_1, primals_2)  @stream 0
streams.record_event(2, 0)  # pin_syncs
streams.wait_event(2, 1)  # pin_syncs
cos = cos(mul)  @stream 1
mul_1 = mul.Tensor(cos, primals_2)  @stream 1
sum_1 = sum(mul_1)
streams.record_event(11, 4)  # dealloc_syncs
streams.sync_dealloc(11, 1, mul_1)  # dealloc_syncs
return [sum_1, primals_1, primals_2, mul, cos]
backward:
input primals_1
input primals_2
input mul
input cos
input tangents_1
expand = expand(tangents_1, [4])
streams.record_event(3, 4)  # backward_syncs
streams.wait_event(3, 1)  # backward_syncs
mul_2 = mul.Tensor(expand, cos)  @stream 1
mul_3 = mul.Tensor(expand, primals_2)  @stream 1
streams.record_event(9, 1)  # dealloc_syncs
streams.sync_dealloc(9, 4, expand)  # dealloc_syncs
sin = sin(mul)  @stream 1
streams.record_event(10, 1)  # dealloc_syncs
streams.sync_dealloc(10, 0, mul)  # dealloc_syncs
neg = neg(sin)  @stream 1
mul_4 = mul.Tensor(mul_3, neg)  @stream 1
streams.record_event(5, 1)  # backward_syncs
streams.wait_event(5, 0)  # backward_syncs
mul_5 = mul.Tensor(mul_4, primals_1)  @stream 0
streams.record_event(6, 0)  # backward_syncs
mul_6 = mul.Tensor(mul_4, primals_2)  @stream 0
streams.record_event(12, 0)  # dealloc_syncs
streams.sync_dealloc(12, 1, mul_4)  # dealloc_syncs
streams.record_event(7, 0)  # backward_syncs
streams.wait_event(6, 1)  # backward_syncs
add = add.Tensor(mul_2, mul_5)  @stream 1  # grad_accumulation
streams.record_event(13, 1)  # dealloc_syncs
streams.sync_dealloc(13, 0, mul_5)  # dealloc_syncs
streams.record_event(8, 1)  # backward_syncs
streams.wait_event(7, 4)  # backward_syncs
streams.wait_event(8, 4)  # backward_syncs
return [mul_6, add]""",
        )

    def test_parameter_on_two_streams(self) -> None:
        self.assertExpectedInline(
            self.graphs("parameter_on_two_streams"),
            """\
forward:
input primals_1
input primals_2
mul = mul.Tensor(primals_1, primals_2)  @stream 0
sin = sin(primals_1)  @stream 1
mul_1 = mul.Tensor(sin, primals_2)  @stream 1
mul_2 = mul.Tensor(mul, mul_1)
sum_1 = sum(mul_2)
return [sum_1, primals_1, primals_2, mul, mul_1]
backward:
input primals_1
input primals_2
input mul
input mul_1
input tangents_1
expand = expand(tangents_1, [4])
mul_3 = mul.Tensor(expand, mul)
streams.record_event(9, 3)  # dealloc_syncs
streams.sync_dealloc(9, 0, mul)  # dealloc_syncs
streams.record_event(2, 3)  # backward_syncs
mul_4 = mul.Tensor(expand, mul_1)
streams.record_event(10, 3)  # dealloc_syncs
streams.sync_dealloc(10, 1, mul_1)  # dealloc_syncs
streams.record_event(4, 3)  # backward_syncs
streams.wait_event(2, 1)  # backward_syncs
sin = sin(primals_1)  @stream 1
mul_5 = mul.Tensor(mul_3, sin)  @stream 1
mul_6 = mul.Tensor(mul_3, primals_2)  @stream 1
streams.record_event(11, 1)  # dealloc_syncs
streams.sync_dealloc(11, 3, mul_3)  # dealloc_syncs
cos = cos(primals_1)  @stream 1
mul_7 = mul.Tensor(mul_6, cos)  @stream 1
streams.wait_event(4, 0)  # backward_syncs
mul_8 = mul.Tensor(mul_4, primals_1)  @stream 0
streams.record_event(6, 0)  # backward_syncs
mul_9 = mul.Tensor(mul_4, primals_2)  @stream 0
streams.record_event(12, 0)  # dealloc_syncs
streams.sync_dealloc(12, 3, mul_4)  # dealloc_syncs
streams.record_event(5, 0)  # backward_syncs
streams.wait_event(5, 1)  # backward_syncs
add = add.Tensor(mul_7, mul_9)  @stream 1  # grad_accumulation
streams.record_event(14, 1)  # dealloc_syncs
streams.sync_dealloc(14, 0, mul_9)  # dealloc_syncs
streams.record_event(7, 1)  # backward_syncs
streams.wait_event(6, 1)  # backward_syncs
add_1 = add.Tensor(mul_5, mul_8)  @stream 1  # grad_accumulation
streams.record_event(13, 1)  # dealloc_syncs
streams.sync_dealloc(13, 0, mul_8)  # dealloc_syncs
streams.record_event(8, 1)  # backward_syncs
streams.wait_event(7, 3)  # backward_syncs
streams.wait_event(8, 3)  # backward_syncs
return [add, add_1]""",
        )

    def test_allocated_here_used_there(self) -> None:
        self.assertExpectedInline(
            self.graphs("allocated_here_used_there"),
            """\
forward:
input primals_1
input primals_2
mul = mul.Tensor(primals_1, primals_2)  @stream 0
tanh = tanh(mul)  @stream 1
streams.record_event(8, 1)  # dealloc_syncs
streams.sync_dealloc(8, 0, mul)  # dealloc_syncs
detach = detach(tanh)  @stream 1
mul_1 = mul.Tensor(tanh, 2)  @stream 1
mul_2 = mul.Tensor(mul_1, primals_2)
sum_1 = sum(mul_2)
detach_1 = detach(detach)  @stream 1
return [sum_1, primals_1, primals_2, mul_1, detach_1]
backward:
input primals_1
input primals_2
input mul_1
input detach_1
input tangents_1
expand = expand(tangents_1, [4])
mul_3 = mul.Tensor(expand, mul_1)
streams.record_event(9, 3)  # dealloc_syncs
streams.sync_dealloc(9, 1, mul_1)  # dealloc_syncs
streams.record_event(5, 3)  # backward_syncs
mul_4 = mul.Tensor(expand, primals_2)
streams.record_event(2, 3)  # backward_syncs
streams.wait_event(2, 1)  # backward_syncs
mul_5 = mul.Tensor(mul_4, 2)  @stream 1
streams.record_event(11, 1)  # dealloc_syncs
streams.sync_dealloc(11, 3, mul_4)  # dealloc_syncs
tanh_backward = tanh_backward(mul_5, detach_1)  @stream 1
streams.record_event(4, 1)  # backward_syncs
streams.wait_event(4, 0)  # backward_syncs
mul_6 = mul.Tensor(tanh_backward, primals_1)  @stream 0
mul_7 = mul.Tensor(tanh_backward, primals_2)  @stream 0
streams.record_event(12, 0)  # dealloc_syncs
streams.sync_dealloc(12, 1, tanh_backward)  # dealloc_syncs
streams.record_event(6, 0)  # backward_syncs
streams.wait_event(5, 0)  # backward_syncs
add = add.Tensor(mul_3, mul_6)  @stream 0  # grad_accumulation
streams.record_event(10, 0)  # dealloc_syncs
streams.sync_dealloc(10, 3, mul_3)  # dealloc_syncs
streams.record_event(7, 0)  # backward_syncs
streams.wait_event(6, 3)  # backward_syncs
streams.wait_event(7, 3)  # backward_syncs
return [mul_7, add]""",
        )

    def test_loss_on_a_side_stream(self) -> None:
        """The compiled backward runs on the current stream: the side stream waits for it
        before reading the incoming gradient, and it waits for the side stream's gradients
        before returning them."""
        self.assertExpectedInline(
            self.graphs("loss_on_a_side_stream"),
            """\
forward:
input primals_1
input primals_2
mul = mul.Tensor(primals_1, primals_2)  @stream 0
sum_1 = sum(mul)  @stream 0
return [sum_1, primals_1, primals_2]
backward:
input primals_1
input primals_2
input tangents_1
streams.record_event(2, 1)  # backward_syncs
streams.wait_event(2, 0)  # backward_syncs
expand = expand(tangents_1, [4])  @stream 0
mul_1 = mul.Tensor(expand, primals_1)  @stream 0
streams.record_event(4, 0)  # backward_syncs
mul_2 = mul.Tensor(expand, primals_2)  @stream 0
streams.record_event(5, 0)  # dealloc_syncs
streams.sync_dealloc(5, 1, expand)  # dealloc_syncs
streams.record_event(3, 0)  # backward_syncs
streams.wait_event(3, 1)  # backward_syncs
streams.wait_event(4, 1)  # backward_syncs
return [mul_2, mul_1]""",
        )

    def test_saved_view_read_elsewhere(self) -> None:
        """The backward's sync_dealloc holds the saved view it reads, not its base."""
        self.assertExpectedInline(
            self.graphs("saved_view_read_elsewhere"),
            """\
forward:
input primals_1
input primals_2
mul = mul.Tensor(primals_1, 2)  @stream 0
unsqueeze = unsqueeze(mul, 0)  @stream 0
mul_1 = mul.Tensor(unsqueeze, primals_2)  @stream 1
sin = sin(mul_1)  @stream 1
sum_1 = sum(sin)
streams.record_event(9, 3)  # dealloc_syncs
streams.sync_dealloc(9, 1, sin)  # dealloc_syncs
cos = cos(mul_1)  @stream 1
return [sum_1, primals_2, unsqueeze, cos]
backward:
input primals_2
input unsqueeze
input cos
input tangents_1
expand = expand(tangents_1, [1, 4])
streams.record_event(2, 3)  # backward_syncs
streams.wait_event(2, 1)  # backward_syncs
mul_2 = mul.Tensor(expand, cos)  @stream 1
streams.record_event(7, 1)  # dealloc_syncs
streams.sync_dealloc(7, 3, expand)  # dealloc_syncs
mul_3 = mul.Tensor(mul_2, unsqueeze)  @stream 1
streams.record_event(8, 1)  # dealloc_syncs
streams.sync_dealloc(8, 0, unsqueeze)  # dealloc_syncs
mul_4 = mul.Tensor(mul_2, primals_2)  @stream 1
streams.record_event(4, 1)  # backward_syncs
sum_2 = sum.dim_IntList(mul_3, [0], True)  @stream 1
streams.record_event(6, 1)  # backward_syncs
view = view(sum_2, [4])  @stream 1
streams.wait_event(4, 0)  # backward_syncs
squeeze = squeeze.dim(mul_4, 0)  @stream 0
mul_5 = mul.Tensor(squeeze, 2)  @stream 0
streams.record_event(10, 0)  # dealloc_syncs
streams.sync_dealloc(10, 1, squeeze)  # dealloc_syncs
streams.record_event(5, 0)  # backward_syncs
streams.wait_event(5, 3)  # backward_syncs
streams.wait_event(6, 3)  # backward_syncs
return [mul_5, view]""",
        )


@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_gradients_equal_eager_for_every_program(backend: str) -> None:
    torch_userstreams.install()
    for name, fn in PROGRAMS.items():
        torch._dynamo.reset()
        args = inputs(name, seed=1)
        want_out, want_grads = eager_reference(name, args)
        compiled = torch.compile(fn, backend=backend)
        copies = clone(args)
        out = compiled(*copies)
        out.backward()
        torch.testing.assert_close(out.detach(), want_out, msg=name)
        got = [c.grad for c in copies if c.requires_grad]
        for g, w in zip(got, want_grads, strict=True):
            torch.testing.assert_close(g, w, msg=name)


@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_an_input_updated_on_a_side_stream_ends_as_eager_leaves_it(backend: str) -> None:
    """The update stays in the graph, on its stream. Left to AOTAutograd's epilogue (plain
    ``aot_autograd``), torch 2.11 and 2.12 refuse it at run time (pytorch#172522)."""
    torch_userstreams.install()
    args = inputs("inplace_on_input", seed=4)
    expected = clone(args)
    with simulated_eager():
        PROGRAMS["inplace_on_input"](*expected)
    got = clone(args)
    torch.compile(PROGRAMS["inplace_on_input"], backend=backend)(*got).backward()
    torch.testing.assert_close(got[2], expected[2])
    torch.testing.assert_close(got[2], args[2] + 1)


def logged(events: list) -> int:  # type: ignore[type-arg]
    return sum(len(event.log) for event in events)


def test_each_backward_resolves_its_own_calls_objects() -> None:
    torch_userstreams.install()
    for name, fn in PROGRAMS.items():
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="userstreams_aot_eager")
        first = compiled(*clone(inputs(name, seed=2)))
        first_events = backward_events(last_binding())
        second = compiled(*clone(inputs(name, seed=3)))
        second_events = backward_events(last_binding())
        assert first_events and second_events, name
        second.backward()
        assert logged(second_events) > 0 and logged(first_events) == 0, name
        first.backward()
        assert logged(first_events) == logged(second_events), name


def test_cpu_backward_with_two_streams_compiles_only_with_the_package() -> None:
    """Native AOTAutograd's dealloc pass needs triton: on CPU the backward cannot compile."""
    torch_userstreams.uninstall()
    torch._dynamo.reset()
    native = torch.compile(PROGRAMS["two_local_streams"], backend="aot_eager")
    try:
        native(*clone(inputs("two_local_streams"))).backward()
    except Exception as exc:  # the native failure this package fixes
        # CPU wheels: no triton to estimate runtimes (2.15: record_stream has no CPU kernel);
        # CUDA wheels on a machine without a GPU: the current stream of "cpu" is refused, or
        # triton finds no GPU driver.
        known = ("triton", "record_stream", "doesn't match the current accelerator", "drivers")
        assert any(reason in str(exc) for reason in known), exc
    else:  # pragma: no cover - a torch that fixed it natively
        raise AssertionError("native backward compiled on CPU: update this test and README")
    torch_userstreams.install()
    torch._dynamo.reset()
    for backend in ("aot_eager", "userstreams_aot_eager"):
        torch._dynamo.reset()
        args = clone(inputs("two_local_streams"))
        torch.compile(PROGRAMS["two_local_streams"], backend=backend)(*args).backward()
        assert all(a.grad is not None for a in args)
