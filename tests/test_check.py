"""``torch_userstreams.check``: a function's stream hazards in one call, each with its fix."""

from __future__ import annotations

import pytest
import torch

import torch_userstreams
from torch_userstreams.simulator import SimEvent, SimStream

BACKENDS = ["userstreams_aot_eager", "userstreams"]


def racy(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    y = x * 2
    with side:
        z = y.sin()  # reads y, made on the current stream, with no wait for it
    return z + 1


def joined(x: torch.Tensor, side: torch.Stream, ready: torch.Event) -> torch.Tensor:
    y = x * 2
    ready.record()
    ready.wait(side)
    with side:
        z = y.sin()
    done = torch.Event(device=x.device)
    done.record(side)
    done.wait()
    return z + 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_racy_function_is_reported_with_the_fix(backend: str) -> None:
    report = torch_userstreams.check(racy, torch.randn(4), SimStream(device="cpu"), backend=backend)
    assert not report
    (hazard,) = report.hazards
    assert hazard.startswith("forward 0: read-after-write: sin on stream")
    assert "reads mul while mul on stream" in hazard
    assert "fix: record an event on stream" in hazard
    assert "and wait for it on stream" in hazard
    assert str(report).startswith("1 stream hazard(s) (1 graph(s) checked):")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_joined_function_is_safe_forward_and_backward(backend: str) -> None:
    x = torch.randn(4, requires_grad=True)
    report = torch_userstreams.check(
        joined, x, SimStream(device="cpu"), SimEvent(device="cpu"), backend=backend
    )
    assert report, str(report)
    assert [label for label, _ in report.graphs] == ["forward 0", "backward 0"]
    assert str(report) == "no stream hazards (2 graph(s) checked)"
    torch.testing.assert_close(report.result, x.detach().mul(2).sin() + 1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_run_under_the_race_detector_names_the_stream_as_passed(backend: str) -> None:
    """With GPU semantics the run is judged as on a GPU: the stream passed in is moved onto
    the fake accelerator and named by its parameter."""
    report = torch_userstreams.check(
        racy,
        torch.randn(4),
        SimStream(device="cpu"),
        backend=backend,
        races=True,
        gpu_semantics=True,
    )
    run = [hazard for hazard in report.hazards if hazard.startswith("run: ")]
    assert len(run) == 1, report
    # Each op runs alone (a region of one kernel runs as its graph), or, in one call per
    # graph, inside the C++ kernel Inductor made of it.
    one_call = backend == "userstreams"
    made = "cpp_fused_mul_0 (graph racy [0/0])" if one_call else "mul.Tensor"
    assert f"on side reads memory allocated by {made}" in run[0], run[0]
    assert f"fix: record an event on the current stream after {made}" in run[0], run[0]


def test_a_joined_function_runs_race_free_with_gpu_semantics() -> None:
    x = torch.randn(4, requires_grad=True)
    report = torch_userstreams.check(
        joined,
        x,
        SimStream(device="cpu"),
        SimEvent(device="cpu"),
        races=True,
        gpu_semantics=True,
    )
    assert report, str(report)
    assert report.races is not None and report.races.kernels > 0


def test_other_compiled_functions_keep_their_code() -> None:
    """check() compiles a fresh copy: nothing else recompiles afterwards."""
    compiles = []

    def counting(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        compiles.append(gm)
        return gm.forward

    other = torch.compile(lambda x: x.cos() + 1, backend=counting)
    other(torch.randn(3))
    torch_userstreams.check(racy, torch.randn(4), SimStream(device="cpu"))
    other(torch.randn(3))
    assert len(compiles) == 1


def test_a_backend_of_another_kind_is_refused_by_name() -> None:
    with pytest.raises(torch_userstreams.UserStreamsError, match=r"backend='inductor' is not one"):
        torch_userstreams.check(racy, torch.randn(4), SimStream(device="cpu"), backend="inductor")


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", BACKENDS)
def test_the_opt_in_check_raises_naming_the_graph_the_ops_and_the_line(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_USERSTREAMS_CHECK", "1")
    torch._dynamo.reset()
    compiled = torch.compile(racy, backend=backend)
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed) as exc:
        compiled(torch.randn(4), SimStream(device="cpu"))
    assert isinstance(exc.value.inner_exception, torch_userstreams.StreamHazardError)
    message = str(exc.value)
    assert "the forward graph of racy [0/0] has 1 stream hazard(s)" in message
    assert "(TORCH_USERSTREAMS_CHECK=raise)" in message
    assert "read-after-write: sin on stream" in message
    assert "fix: record an event on stream" in message
    # the lines of ``y = x * 2`` and ``z = y.sin()``
    assert "at: mul at " in message and "test_check.py:15 in racy, sin at " in message, message
    assert message.split("sin at ")[1].split()[0].endswith("test_check.py:17"), message


@pytest.mark.usefixtures("installed")
def test_the_opt_in_check_can_warn_and_compile_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_USERSTREAMS_CHECK", "warn")
    torch._dynamo.reset()
    x = torch.randn(4)
    with pytest.warns(torch_userstreams.StreamHazardWarning, match="1 stream hazard"):
        out = torch.compile(racy, backend="userstreams_aot_eager")(x, SimStream(device="cpu"))
    torch.testing.assert_close(out, (x * 2).sin() + 1)


@pytest.mark.usefixtures("installed")
def test_the_opt_in_check_passes_a_safe_graph_and_refuses_a_typo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCH_USERSTREAMS_CHECK", "1")
    torch._dynamo.reset()
    x = torch.randn(4, requires_grad=True)
    streams = SimStream(device="cpu"), SimEvent(device="cpu")
    torch.compile(joined, backend="userstreams_aot_eager")(x, *streams).sum().backward()
    monkeypatch.setenv("TORCH_USERSTREAMS_CHECK", "yes")
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed, match="'yes' is not a setting"):
        torch.compile(joined, backend="userstreams_aot_eager")(x, *streams)


def test_a_check_leaves_the_gradients_as_they_were() -> None:
    """It runs the backward twice (``races=True``): the parameters' ``.grad`` must not be
    trained by a check (helper-1's review: doubled gradients)."""
    linear = torch.nn.Linear(4, 4)
    before = torch.ones(4, 4)
    grad = linear.weight.grad = before.clone()

    def step(x: torch.Tensor, side: torch.Stream, ready: torch.Event) -> torch.Tensor:
        return joined(linear(x), side, ready)

    streams = SimStream(device="cpu"), SimEvent(device="cpu")
    report = torch_userstreams.check(step, torch.randn(2, 4), *streams, races=True)
    assert report, str(report)
    assert linear.weight.grad is grad, "the user's own gradient tensor"
    torch.testing.assert_close(grad, before)
    assert linear.bias.grad is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_check_reports_under_the_opt_in_check_instead_of_failing(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_USERSTREAMS_CHECK", "1")
    report = torch_userstreams.check(racy, torch.randn(4), SimStream(device="cpu"), backend=backend)
    assert len(report.hazards) == 1
