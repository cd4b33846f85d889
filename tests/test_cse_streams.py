"""AOTAutograd's CSE (before min-cut partitions, so ``userstreams``) merges equal nodes: never
across streams, never syncs (``patch.cse``).

Found by a hostile test pass: ``x * w`` written on a side stream and again on the main one
was computed once, on the side stream, and read on the main one before any wait; on torch
2.11 a second ``s.wait_stream(m)`` with the same arguments was dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import torch_userstreams
from torch_userstreams.fx.control_deps import sync_of
from torch_userstreams.testing import assert_stream_safe, capture
from torch_userstreams.testing.capture import no_compile_caches
from torch_userstreams.testing.fake_accelerator import FakeAcceleratorStream, fake_accelerator

BACKENDS = ["userstreams", "userstreams_aot_eager"]
WAIT_STREAM = torch.ops.streams.wait_stream.default


@pytest.fixture(autouse=True)
def accelerator() -> Iterator[None]:
    torch_userstreams.install()
    with fake_accelerator(), no_compile_caches():
        yield


def count(gm: torch.fx.GraphModule, target: object) -> int:
    return sum(node.target is target for node in gm.graph.nodes)


def same_product_on_two_streams(
    x: torch.Tensor, w: torch.Tensor, m: torch.Stream, s: torch.Stream
) -> torch.Tensor:
    s.wait_stream(m)
    with s:
        a = (x * w).sin()
    with m:
        b = (x * w).cos()
    m.wait_stream(s)
    with m:
        return (a + b).sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_equal_work_on_two_streams_is_not_merged(backend: str) -> None:
    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    streams = FakeAcceleratorStream(), FakeAcceleratorStream()
    captured = capture(same_product_on_two_streams, x, w, *streams, backend=backend)
    [forward] = captured.forward
    assert count(forward, torch.ops.aten.mul.Tensor) == 2
    for _, gm in captured.graphs:
        assert_stream_safe(gm)
    expected = torch.autograd.grad(same_product_on_two_streams(x, w, *streams), (x, w))
    torch.testing.assert_close((x.grad, w.grad), expected)


def same_product_on_one_stream(x: torch.Tensor, w: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        return ((x * w).sin() + (x * w).cos()).sum()


def test_equal_work_on_one_stream_is_still_merged() -> None:
    x, w = torch.randn(3, requires_grad=True), torch.randn(3, requires_grad=True)
    captured = capture(
        same_product_on_one_stream, x, w, FakeAcceleratorStream(), backend="userstreams"
    )
    assert count(captured.forward[0], torch.ops.aten.mul.Tensor) == 1


def waits_twice(x: torch.Tensor, m: torch.Stream, s: torch.Stream) -> torch.Tensor:
    s.wait_stream(m)
    with s:
        a = x.sin()
    with m:
        b = x.cos() * 2
    s.wait_stream(m)  # again: b is made on m after the first wait
    with s:
        c = a + b
    m.wait_stream(s)
    with m:
        return c.sum()


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_sync_repeated_with_the_same_arguments_is_kept(backend: str) -> None:
    x = torch.randn(3, requires_grad=True)
    m, s = FakeAcceleratorStream(), FakeAcceleratorStream()
    captured = capture(waits_twice, x, m, s, backend=backend)
    [forward] = captured.forward
    assert_stream_safe(forward)
    syncs = [sync_of(forward, node) for node in forward.graph.nodes]
    waits = [sync.args for sync in syncs if sync is not None and sync.op is WAIT_STREAM]
    assert len(waits) == 3, waits
