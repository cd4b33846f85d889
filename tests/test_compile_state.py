"""What one graph compile leaves behind, and what happens outside any compile."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from helpers import forget_bindings

import torch_userstreams
from torch_userstreams.errors import NotCompilingError
from torch_userstreams.run.state import state
from torch_userstreams.simulator import SimStream


def side(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        y = x.sin()
    return y + 1


@pytest.mark.usefixtures("installed")
def test_a_compiled_graph_is_freed_with_dynamo_reset() -> None:
    compiled = torch.compile(side, backend="aot_eager")
    compiled(torch.ones(2), SimStream(device="cpu"))
    (compile_,) = state.compiles
    bound = weakref.ref(compile_.bound)
    assert bound() is not None
    del compiled
    forget_bindings()  # conftest's spy holds the last call's binding
    torch._dynamo.reset()
    gc.collect()
    assert bound() is None, "the finished compile kept the compiled graph alive"


def test_uninstall_forgets_this_threads_compiles() -> None:
    with torch_userstreams.installed():
        torch.compile(side, backend="aot_eager")(torch.ones(2), SimStream(device="cpu"))
        assert state.compiles
    assert state.compiles == []


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("name", ["new_stream", "new_event"])
def test_dynamos_object_requests_outside_a_compile_raise(name: str) -> None:
    from torch._dynamo.variables import streams

    before = list(state.compiles)
    with pytest.raises(NotCompilingError, match=f"Dynamo's {name} was called while"):
        getattr(streams, name)(device="cpu")
    assert state.compiles == before, "no compile was made for the stray request"


class Waits(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        done = torch.Event(device="cpu")
        done.wait(torch.Stream(device="cpu"))
        side = torch.Stream(device="cpu")
        with side:
            a = x * 2
        return a + 0  # a is made on side and read on the current stream


# AOTAutograd calls the sync-ordering pass outside torch.compile too (here in export's
# decompositions); it raised NotCompilingError there during the redesign.
@pytest.mark.usefixtures("installed")
def test_export_decompositions_run_the_sync_passes_without_a_compile() -> None:
    x = torch.ones(2)
    decomposed = torch.export.export(Waits(), (x,), strict=True).run_decompositions()
    targets = [str(node.target) for node in decomposed.graph.nodes]
    assert "streams.wait_event.default" in targets, targets
    torch.testing.assert_close(decomposed.module()(x), x * 2)


def affine(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return (x @ w).relu()


@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_a_recompile_after_uninstall_without_streams_compiles_as_native(backend: str) -> None:
    """A last batch of another size after an ``installed()`` block recompiles with the
    package uninstalled. The backend refused the graph, and installed the package from
    inside the failing call."""
    w = torch.randn(4, 2, requires_grad=True)
    with torch_userstreams.installed():
        compiled = torch.compile(affine, backend=backend)
        compiled(torch.randn(8, 4), w).sum().backward()
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x, w), affine(x, w))
    assert not torch_userstreams.is_installed()


@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_a_recompile_after_uninstall_with_streams_is_refused_and_installs_nothing(
    backend: str,
) -> None:
    with torch_userstreams.installed():
        compiled = torch.compile(side, backend=backend)
        compiled(torch.ones(2), SimStream(device="cpu"))
    with pytest.raises(
        Exception, match=r"(?s)uses streams or events \(in side, compile 0/1\).*not installed"
    ):
        compiled(torch.ones(3), SimStream(device="cpu"))
    assert not torch_userstreams.is_installed()
    torch_userstreams.install()
    torch.testing.assert_close(
        compiled(torch.ones(3), SimStream(device="cpu")),
        side(torch.ones(3), SimStream(device="cpu")),
    )


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
def test_a_stream_graph_handed_to_the_backend_directly_is_refused_naming_the_fix(
    backend: str,
) -> None:
    """Installed, but no Dynamo compile holds the graph: the error said "not installed"."""
    from torch_userstreams.backends import _BY_NAME

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.call_function(torch.ops.streams.record_event.default, (0, 1))
    graph.output(x)
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(
        torch_userstreams.UnsupportedPathError,
        match=rf"\(not traced by Dynamo\) that no torch.compile.*backend='{backend}'",
    ):
        _BY_NAME[backend](gm, [torch.ones(1)])


def _record_on(x: torch.Tensor, s: torch.Stream, ev: torch.Event) -> torch.Tensor:
    with s:
        y = x * 2
    ev.record(s)
    return y


def _record_after(x: torch.Tensor, s: torch.Stream, ev: torch.Event) -> torch.Tensor:
    y = x + 1
    ev.record(s)
    return y


def _outer(x: torch.Tensor, s: torch.Stream, ev: torch.Event) -> torch.Tensor:
    with s:
        y = x.sin()
    ev.record(s)
    return y


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("inner", [_record_on, _record_after], ids=["with_stream", "record_only"])
def test_a_backend_may_compile_another_stream_function(inner: object) -> None:
    """A backend that calls (and so compiles) another compiled function while it compiles
    its graph: the inner function's objects were registered in the outer graph's table."""
    from torch_userstreams.backends import userstreams_aot_eager_backend
    from torch_userstreams.simulator import SimEvent

    compiled_inner = torch.compile(inner, backend="userstreams_aot_eager")

    def records(stream: SimStream, run: object) -> list[object]:
        event = SimEvent(device="cpu")
        run(torch.ones(2), stream, event)  # type: ignore[operator]
        return [s for _, s in event.log]

    inner_streams: list[SimStream] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> object:  # type: ignore[type-arg]
        inner_streams.append(SimStream(device="cpu"))
        assert records(inner_streams[-1], compiled_inner) == [inner_streams[-1]]
        return userstreams_aot_eager_backend(gm, example_inputs)

    outer = torch.compile(_outer, backend=backend)
    for _ in range(2):  # the first call compiles both, the second reuses both
        stream = SimStream(device="cpu")
        assert records(stream, outer) == [stream]
        again = SimStream(device="cpu")
        assert records(again, compiled_inner) == [again]
    assert len(inner_streams) == 1
