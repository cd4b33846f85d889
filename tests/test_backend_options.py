"""``torch.compile(backend="userstreams", mode=..., options=...)``: Inductor's settings,
for the forward and the backward, with or without streams; unknown ones are refused with
their name. ``userstreams_aot_eager`` checks the names and warns that it ignores them (native
``aot_eager`` logs that it does)."""

from __future__ import annotations

import pytest
import torch
from helpers import Messages
from torch._inductor.custom_graph_pass import CustomGraphPass

import torch_userstreams
from torch_userstreams.testing.capture import no_compile_caches


class CountGraphs(CustomGraphPass):
    """A post-grad pass that counts the graphs Inductor compiles with it."""

    def __init__(self) -> None:
        self.graphs = 0

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.graphs += 1

    def uuid(self) -> str:
        return "tests.test_backend_options.CountGraphs"


def side_stream_sin(x: torch.Tensor) -> torch.Tensor:
    with torch.Stream(device="cpu"):
        y = x.sin()
    return y * 2


def plain_sin(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2


@pytest.fixture(autouse=True)
def fresh() -> None:
    torch_userstreams.install()
    torch._dynamo.reset()


@pytest.mark.parametrize("fn", [side_stream_sin, plain_sin], ids=["streams", "no streams"])
def test_options_reach_the_forward_and_backward_compiles(fn: object) -> None:
    counter = CountGraphs()
    compiled = torch.compile(
        fn, backend="userstreams", options={"post_grad_custom_post_pass": counter}
    )
    x = torch.randn(4, requires_grad=True)
    with no_compile_caches():
        compiled(x).sum().backward()
    assert counter.graphs == 2
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())


def test_a_mode_compiles() -> None:
    compiled = torch.compile(
        side_stream_sin, backend="userstreams", mode="max-autotune-no-cudagraphs"
    )
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), 2 * x.sin())


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"mode": "max-autotune-no-cudagraphs"}, "mode='max-autotune-no-cudagraphs'"),
        ({"options": {"epilogue_fusion": False, "max_autotune": True}}, "epilogue_fusion, max_"),
    ],
)
def test_the_debugging_backend_names_the_settings_it_ignores(kwargs: dict, named: str) -> None:
    compiled = torch.compile(side_stream_sin, backend="userstreams_aot_eager", **kwargs)
    x = torch.randn(4)
    with pytest.warns(UserWarning) as warned:
        torch.testing.assert_close(compiled(x), 2 * x.sin())
    [message] = [str(w.message) for w in warned if "torch_userstreams" in str(w.message)]
    assert f"backend 'userstreams_aot_eager' ignores {named}" in message
    assert "they configure Inductor" in message


@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"mode": "fastest"}, "mode='fastest'"),
        ({"options": {"max_autotunez": True}}, "did you mean 'max_autotune' for 'max_autotunez'?"),
        ({"options": {"zzz_not_a_setting": 1}}, "(torch._inductor.config). Check the names"),
        ({"options": ["max_autotune"]}, "options is a dict of Inductor config names to values"),
    ],
)
def test_unknown_settings_are_refused_by_name(backend: str, kwargs: dict, named: str) -> None:
    compiled = torch.compile(plain_sin, backend=backend, **kwargs)
    with pytest.raises(Exception, match="torch_userstreams") as raised:
        compiled(torch.randn(4))
    assert f"backend {backend!r} got" in str(raised.value)
    assert named in str(raised.value)


def fake_accelerator_sin(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    side.wait_stream(torch.accelerator.current_stream())
    with side:
        y = x.sin() * 2
    torch.accelerator.current_stream().wait_stream(side)
    return y


def test_reduce_overhead_on_a_graph_with_streams_says_it_runs_without_cuda_graphs() -> None:
    """It was silent (issue 40): the user asked for CUDA graphs and got none. The skip is
    logged on Inductor's own cudagraphs log, as Inductor logs its skips."""
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_utils import cudagraphs_log

    from torch_userstreams.testing.fake_accelerator import FakeAcceleratorStream, fake_accelerator

    counters.clear()
    handler = Messages()
    cudagraphs_log.addHandler(handler)
    x = torch.randn(4, requires_grad=True)
    try:
        with fake_accelerator(), no_compile_caches():
            compiled = torch.compile(
                fake_accelerator_sin, backend="userstreams", mode="reduce-overhead"
            )
            compiled(x, FakeAcceleratorStream()).sum().backward()
    finally:
        cudagraphs_log.removeHandler(handler)
    skips = [m for m in handler.messages if "torch_userstreams: graph" in m]
    assert len(skips) == 2, skips  # the forward and the backward
    assert skips[0].startswith("skipping cudagraphs due to torch_userstreams: graph ")
    assert "fake_accelerator_sin" in skips[0], skips[0]
    assert counters["inductor"]["cudagraph_skips"] >= 2
    torch.testing.assert_close(x.grad, 2 * x.detach().cos())


def test_cudagraph_or_error_turns_the_skip_into_an_error_naming_the_graph() -> None:
    from torch_userstreams.testing.fake_accelerator import FakeAcceleratorStream, fake_accelerator

    compiled = torch.compile(
        fake_accelerator_sin,
        backend="userstreams",
        options={"triton.cudagraphs": True, "triton.cudagraph_or_error": True},
    )
    with fake_accelerator(), no_compile_caches(), pytest.raises(Exception) as caught:
        compiled(torch.randn(4), FakeAcceleratorStream())
    assert "torch_userstreams: graph fake_accelerator_sin" in str(caught.value), caught.value
