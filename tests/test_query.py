"""``Stream.query()`` / ``Event.query()`` in a compiled function run on every call
(``patch.queries``).

Dynamo traces ``query()`` into the answer it gave while compiling: a branch on it was
decided once, and every later call took it whatever the device's state (found by a hostile
test pass; native Dynamo does the same).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import torch_userstreams
from torch_userstreams.testing.fake_accelerator import (
    FakeAcceleratorEvent,
    FakeAcceleratorStream,
    fake_accelerator,
)

BACKENDS = ["userstreams", "userstreams_aot_eager"]


class ReportingEvent(FakeAcceleratorEvent):
    """An event whose ``query()`` answers what the test set."""

    def __init__(self, done: bool) -> None:
        super().__init__()
        self.done = done

    def query(self) -> bool:
        self.log.append(("query", None))
        return self.done


class ReportingStream(FakeAcceleratorStream):
    def __init__(self, done: bool) -> None:
        super().__init__()
        self.done = done

    def query(self) -> bool:
        self.log.append(("query", None))
        return self.done


@pytest.fixture(autouse=True)
def accelerator() -> Iterator[None]:
    torch_userstreams.install()
    with fake_accelerator():
        yield


def use_if_ready(x: torch.Tensor, ready: torch.Event | torch.Stream) -> torch.Tensor:
    if ready.query():
        return x * 2
    return x * 3


@pytest.mark.parametrize("kind", [ReportingEvent, ReportingStream])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_branch_on_query_follows_each_calls_answer(backend: str, kind: type) -> None:
    compiled = torch.compile(use_if_ready, backend=backend)
    x = torch.ones(2)
    got = [compiled(x, kind(done)) for done in (False, True, False)]
    torch.testing.assert_close(got, [x * 3, x * 2, x * 3])


@pytest.mark.parametrize("kind", [ReportingEvent, ReportingStream])
def test_query_runs_once_per_call(kind: type) -> None:
    compiled = torch.compile(use_if_ready, backend="userstreams")
    for _ in range(3):
        ready = kind(done=True)
        compiled(torch.ones(2), ready)
        assert [name for name, _ in ready.log] == ["query"]


def query_inside_the_block(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    with side:
        y = x * 2
        if side.query():
            y = y + 1
    return y.sin()


def test_query_inside_a_stream_block_runs_the_function_eagerly_and_says_why() -> None:
    """Dynamo cannot resume inside ``with stream:`` after the graph break: it runs the whole
    frame eagerly. Right answers, nothing compiled; the graph break says how to compile it."""
    counter = CompileCounterWithBackend("userstreams")
    compiled = torch.compile(query_inside_the_block, backend=counter)
    x = torch.ones(2)
    for done in (True, False):
        side = ReportingStream(done)
        torch.testing.assert_close(compiled(x, side), query_inside_the_block(x, side))
    assert counter.frame_count == 0
    torch._dynamo.reset()  # the frame is marked to run eagerly
    with pytest.raises(Exception, match=r"(?s)inside a `with stream:` block.*before or after"):
        torch.compile(query_inside_the_block, backend="userstreams", fullgraph=True)(
            x, ReportingStream(True)
        )


def test_query_under_fullgraph_is_an_error_naming_it() -> None:
    compiled = torch.compile(use_if_ready, backend="userstreams", fullgraph=True)
    with pytest.raises(
        Exception, match=r"(?s)ReportingEvent\.query\(\) reports.*move query\(\) out"
    ):
        compiled(torch.ones(2), ReportingEvent(done=True))


def query_then_use_a_made_stream(x: torch.Tensor, ready: torch.Event) -> torch.Tensor:
    side = torch.Stream(device="cpu")
    with side:
        y = x * 2
    if ready.query():
        y = y + 1
    with side:
        return y.sin()


def query_then_use_a_stream_from_a_list(
    x: torch.Tensor, streams: list[torch.Stream], ready: torch.Event
) -> torch.Tensor:
    side = streams[0]
    with side:
        y = x * 2
    if ready.query():
        y = y + 1
    with side:
        return y.sin()


def query_after_the_last_use_of_a_made_stream(x: torch.Tensor, ready: torch.Event) -> torch.Tensor:
    side = torch.Stream(device="cpu")
    with side:
        y = x * 2
    if ready.query():
        y = y + 1
    return y.sin()


def _traced_ops(fn: Callable[..., torch.Tensor], *args: object) -> list[str]:
    """The ops of every graph Dynamo compiled for one call of ``fn``."""
    ops: list[str] = []

    def backend(gm: torch.fx.GraphModule, example_inputs: object) -> Callable[..., object]:
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op.startswith("call_"))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(fn, backend=backend)(*args)
    return ops


@pytest.mark.parametrize(
    ("fn", "blocks_resume"),
    [
        (query_then_use_a_made_stream, True),
        (query_then_use_a_stream_from_a_list, True),
        (query_after_the_last_use_of_a_made_stream, False),
    ],
)
def test_query_says_when_a_stream_used_after_it_makes_the_rest_run_eagerly(
    fn: Callable[..., torch.Tensor], blocks_resume: bool
) -> None:
    """Dynamo cannot carry a stream that is not an argument of the compiled function across
    a graph break: if the code after ``query()`` uses one, the rest runs eagerly (``sin`` is
    in no graph), and the graph break says so; otherwise the rest compiles."""
    x = torch.ones(2)
    args = (x, [FakeAcceleratorStream()]) if "list" in fn.__name__ else (x,)
    ops = _traced_ops(fn, *args, ReportingEvent(True))
    assert any("sin" in op for op in ops) != blocks_resume, ops
    for done in (True, False):
        expected = fn(*args, ReportingEvent(done))
        torch.testing.assert_close(
            torch.compile(fn, backend="userstreams")(*args, ReportingEvent(done)), expected
        )
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported, match=r"query\(\)") as raised:
        torch.compile(fn, backend="userstreams", fullgraph=True)(*args, ReportingEvent(True))
    said = "the rest of the function runs eagerly" in str(raised.value)
    assert said == blocks_resume
