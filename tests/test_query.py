"""``Stream.query()`` / ``Event.query()`` in a compiled function run on every call
(``patch.queries``).

Dynamo traces ``query()`` into the answer it gave while compiling: a branch on it was
decided once, and every later call took it whatever the device's state (found by a hostile
test pass; native Dynamo does the same).
"""

from __future__ import annotations

from collections.abc import Iterator

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


def query_after_making_a_stream(x: torch.Tensor, ready: torch.Event) -> torch.Tensor:
    side = torch.Stream(device="cpu")
    with side:
        y = x * 2
    if ready.query():
        y = y + 1
    return y.sin()


def test_query_while_a_stream_the_function_made_is_live_says_the_rest_runs_eagerly() -> None:
    """After the block too, Dynamo cannot carry a stream the function created across the
    graph break: the rest of the function runs eagerly, and the break says so."""
    compiled = torch.compile(query_after_making_a_stream, backend="userstreams")
    x = torch.ones(2)
    for done in (True, False):
        expected = query_after_making_a_stream(x, ReportingEvent(done))
        torch.testing.assert_close(compiled(x, ReportingEvent(done)), expected)
    torch._dynamo.reset()
    compiled = torch.compile(query_after_making_a_stream, backend="userstreams", fullgraph=True)
    with pytest.raises(
        Exception, match=r"(?s)holds a stream it created.*runs eagerly.*pass it in"
    ) as raised:
        compiled(x, ReportingEvent(True))
    assert "`with stream:` block" not in str(raised.value)
