"""Objects a backend requests while compiling are built per call, as asked."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from probes import insert_probe, requesting_backend, seen

import torch_userstreams
from torch_userstreams.compile import graph_compile
from torch_userstreams.demo.model import simulated_objects
from torch_userstreams.errors import NotCompilingError
from torch_userstreams.simulator import SimEvent, SimStream

pytestmark = pytest.mark.usefixtures("installed")


def add_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def test_requested_objects_are_fresh_per_call_and_match_the_prologue() -> None:
    def request() -> list[int]:
        return [
            torch_userstreams.new_event(device="cpu", enable_timing=True),
            torch_userstreams.new_stream(device="cpu"),
        ]

    seen().clear()
    compiled = torch.compile(add_one, backend=requesting_backend(request))
    for _ in range(3):
        assert torch.equal(compiled(torch.ones(2)), torch.full((2,), 2.0))
    calls = seen()
    assert len(calls) == 3
    events = [event for event, _ in calls]
    streams = [stream for _, stream in calls]
    assert len({id(e) for e in events}) == 3, "a fresh event each call"
    assert len({id(s) for s in streams}) == 3, "a fresh stream each call"
    for event, stream in calls:
        assert isinstance(event, SimEvent) and event.device == torch.device("cpu")
        assert isinstance(stream, SimStream) and stream.device.type == "cpu"


def test_requested_event_keeps_its_flags() -> None:
    """Native rebuilds requested objects with no arguments; we keep device and flags."""
    captured: list[torch.Event] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        index = torch_userstreams.new_event(device="cpu", enable_timing=True)
        insert_probe(gm, [index])
        return gm

    seen().clear()
    torch.compile(add_one, backend=backend)(torch.ones(1))
    (event,) = seen()[0]
    captured.append(event)
    # The flag is visible through the event's construction arguments on every build.
    assert event.device == torch.device("cpu")
    assert (
        "enable_timing=True"
        in torch_userstreams.explain(add_one, torch.ones(1), backend=backend).tables[0].describe()
    )


def test_input_stream_is_the_very_object_passed() -> None:
    def with_stream(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
        with s:
            return x * 2

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        from probes import stream_input_indices

        insert_probe(gm, stream_input_indices(gm))
        return gm

    seen().clear()
    compiled = torch.compile(with_stream, backend=backend)
    streams = [SimStream(device="cpu") for _ in range(3)]
    for stream in streams:
        compiled(torch.ones(2), stream)
    assert [call[0] for call in seen()] == streams
    assert all(got is want for (got,), want in zip(seen(), streams, strict=True))


def test_compile_time_api_outside_a_compile_raises() -> None:
    for call in (
        torch_userstreams.new_stream,
        torch_userstreams.new_event,
        torch_userstreams.current_stream,
    ):
        with pytest.raises(NotCompilingError, match="outside a compile"):
            call()


def test_a_request_from_the_compiled_function_points_to_torch_objects() -> None:
    """Dynamo runs the call eagerly after a graph break, outside the compile; the user
    meant an event of the function's own (helper-35)."""

    def makes_an_index(x: torch.Tensor) -> torch.Tensor:
        torch_userstreams.new_event(device="cpu")
        return x + 1

    compiled = torch.compile(makes_an_index, backend="userstreams_aot_eager")
    with pytest.raises(NotCompilingError, match="outside a compile") as exc:
        compiled(torch.ones(1))
    assert "The function you compile makes its own objects with torch.Stream(...)" in str(exc.value)


def test_a_request_from_a_lazily_compiled_backward_says_where_to_make_it() -> None:
    from torch._dynamo.backends.common import aot_autograd

    def backward_compiler(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        torch_userstreams.new_event(device="cpu", phase="backward")
        return gm

    backend = aot_autograd(fw_compiler=lambda gm, _: gm, bw_compiler=backward_compiler)
    compiled = torch.compile(lambda x: (x * 2).sin(), backend=backend)
    out = compiled(torch.ones(3, requires_grad=True)).sum()
    with pytest.raises(NotCompilingError, match="outside a compile") as exc:
        out.backward()
    message = str(exc.value)
    assert "It was called while a backward runs. If that is an AOTAutograd bw_compiler" in message
    assert "phase='backward' while the forward compiles" in message
    assert "force_non_lazy_backward_lowering = True" in message
    with pytest.raises(NotCompilingError) as exc:
        torch_userstreams.new_event(device="cpu")
    assert "backward" not in str(exc.value)  # no hint outside a backward


def test_lookup_outside_a_call_raises() -> None:
    torch_userstreams.uninstall()
    with pytest.raises(torch_userstreams.UserObjectError, match="outside any compiled call"):
        torch_userstreams.lookup(0)


def test_the_current_stream_of_a_device_this_machine_lacks_is_refused_by_name() -> None:
    """torch answered only "Accelerator expected"."""
    available = torch.accelerator.is_available()
    accelerator = torch.accelerator.current_accelerator() if available else None
    absent = "xpu" if accelerator is not None and accelerator.type == "cuda" else "cuda"

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        torch_userstreams.current_stream(absent, added_by="my_backend")
        return gm

    compiled = torch.compile(add_one, backend=backend)
    with pytest.raises(Exception, match="asked graph") as exc:
        compiled(torch.ones(1))
    message = str(exc.value)
    assert f"my_backend asked graph add_one [0/0] for the current stream of '{absent}'" in message
    assert "compile for that device" in message


@pytest.mark.parametrize("request_one", [torch_userstreams.new_stream, torch_userstreams.new_event])
def test_an_object_of_a_device_this_machine_lacks_is_refused_by_name(request_one: Any) -> None:
    """torch answered only "PyTorch is not linked with support for cuda devices"."""
    absent = "xpu" if torch.accelerator.is_available() else "cuda"

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        request_one(absent, added_by="my_backend")
        return gm

    with pytest.raises(Exception, match="asked graph") as exc:
        torch.compile(add_one, backend=backend)(torch.ones(1))
    kind = "Stream" if request_one is torch_userstreams.new_stream else "Event"
    assert f"my_backend asked graph add_one [0/0] for torch.{kind}(device='{absent}')" in str(
        exc.value
    )
    assert "request objects of a device torch runs here" in str(exc.value)


@pytest.mark.parametrize(
    "request_one",
    [torch_userstreams.new_stream, torch_userstreams.new_event, torch_userstreams.current_stream],
)
def test_an_accelerator_index_past_the_device_count_is_refused_by_name(request_one: Any) -> None:
    """On a one-GPU machine torch answers "invalid device ordinal", or nothing until a sync
    on the missing device; the fake accelerator has one device, ``cuda:0``."""
    from torch_userstreams.testing.fake_accelerator import fake_accelerator

    def backend(gm: torch.fx.GraphModule, example_inputs: list) -> torch.fx.GraphModule:
        request_one("cuda:1", added_by="my_backend")
        return gm

    with fake_accelerator():
        with pytest.raises(Exception, match="asked graph") as exc:
            torch.compile(add_one, backend=backend)(torch.ones(1))
        message = str(exc.value)
        assert "my_backend asked graph add_one [0/0] for " in message
        assert "'cuda:1'" in message
        assert "this machine has 1 'cuda' device(s), numbered from 0" in message

        def backend_on_device_zero(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
            request_one("cuda:0", added_by="my_backend")
            request_one("cuda", added_by="my_backend")
            return gm

        torch._dynamo.reset()
        compiled = torch.compile(add_one, backend=backend_on_device_zero)
        assert torch.equal(compiled(torch.ones(1)), torch.full((1,), 2.0))


def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.sin() * w


def side_stream_product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    s = torch.Stream(device="cpu")
    with s:
        y = x * w
    return y.sin() * w


@pytest.mark.parametrize("fn", [product, side_stream_product])
def test_objects_a_backend_reads_from_its_own_code_are_made_when_it_hands_off(fn: Any) -> None:
    """A backend requests objects, compiles with ``userstreams`` (which removes every sync
    on CPU) and reads them from its own code at run time: the prologue still makes them,
    though no compiled graph reads them, and calls still bind the backward."""
    from torch_userstreams.backends import userstreams_backend

    read: list[tuple[Any, Any]] = []
    tables: list[Any] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        event = torch_userstreams.new_event(device="cpu")
        current = torch_userstreams.current_stream("cpu")
        tables.append(graph_compile.active("test").table)
        compiled = userstreams_backend(gm, example_inputs)

        def run(*args: Any) -> Any:
            read.append((torch_userstreams.lookup(event), torch_userstreams.lookup(current)))
            return compiled(*args)

        return run

    compiled = torch.compile(fn, backend=backend)
    for _ in range(2):
        x, w = (torch.rand(4, requires_grad=True) for _ in range(2))
        compiled(x, w).sum().backward()
        x2, w2 = (t.detach().clone().requires_grad_(True) for t in (x, w))
        with simulated_objects(torch.device("cpu")):
            fn(x2, w2).sum().backward()
        torch.testing.assert_close([x.grad, w.grad], [x2.grad, w2.grad])
    assert [(type(e), type(s)) for e, s in read] == [(SimEvent, SimStream)] * 2
    assert read[0][0] is not read[1][0], "a fresh event each call"
    (table,) = tables
    assert all(table.loads(e.index) for e in table.entries if e.added_by == "backend")
    assert table.plan is not None and table.plan.backward_bound


@pytest.mark.parametrize("api", ["new_stream", "new_event"])
def test_a_phase_that_is_none_names_the_valid_ones(api: str) -> None:
    """It said ``'bwd' is not a valid Phase``, without the values that are."""
    import torch_userstreams.api

    compiles: list[Exception] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> object:
        try:
            getattr(torch_userstreams.api, api)("cpu", phase="bwd")
        except ValueError as exc:
            compiles.append(exc)
        return gm.forward

    with torch_userstreams.installed():
        torch.compile(lambda x: x + 1, backend=backend)(torch.ones(2))
    (error,) = compiles
    assert str(error) == (
        f"torch_userstreams.{api}: phase='bwd' is not a phase; use one of 'forward', "
        "'backward' (or torch_userstreams.compile.table.Phase): the graph that reads the object."
    )


@pytest.mark.parametrize("index", ["side", 1.0])
def test_a_lookup_by_name_outside_a_call_says_an_index_is_expected(index: object) -> None:
    with pytest.raises(torch_userstreams.UserObjectError) as exc:
        torch_userstreams.lookup(index)  # type: ignore[arg-type]
    assert str(exc.value) == (
        f"torch_userstreams.lookup({index!r}): lookup takes a graph's integer table index (what "
        "new_stream(), new_event() or current_stream() returned while the graph compiled), not "
        f"a {type(index).__name__}; a stream's name is not an index."
    )
