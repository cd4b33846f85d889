"""Streams inside subgraphs: checkpointed functions, ``nested_compile_region`` and
``torch.cond`` branches compile with both package backends and give eager's gradients.

On CPU streams (every sync satisfied by program order) and on the fake accelerator (the
``userstreams`` graph runs as regions on its streams, the constructs' subgraphs inside them).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from torch_userstreams.simulator import SimStream
from torch_userstreams.testing.fake_accelerator import FakeAcceleratorStream, fake_accelerator


def on_stream(x: torch.Tensor, w: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        y = (x * w).sin()
    return y * w


def checkpointed(x: torch.Tensor, w: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    return checkpoint(on_stream, x, w, s, use_reentrant=False).sum()  # type: ignore[no-any-return]


def checkpointed_reentrant(x: torch.Tensor, w: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    return checkpoint(on_stream, x, w, s, use_reentrant=True).sum()  # type: ignore[no-any-return]


region = torch.compiler.nested_compile_region(on_stream)


def nested_region(x: torch.Tensor, w: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    return region(x, w, s).sum()


def cond_branch(x: torch.Tensor, w: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    def streamed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        with s:
            return (x * w).sin() * w

    def plain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x * w).cos()

    return torch.cond(x.sum() > 0, streamed, plain, (x, w)).sum()


CONSTRUCTS: dict[str, Callable[..., torch.Tensor]] = {
    "checkpoint": checkpointed,
    "checkpoint-reentrant": checkpointed_reentrant,
    "nested_compile_region": nested_region,
    "cond": cond_branch,
}


@contextlib.contextmanager
def side_stream(device: str) -> Iterator[torch.Stream]:
    if device == "cpu":
        yield SimStream(device="cpu")
        return
    with fake_accelerator():
        yield FakeAcceleratorStream()


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("device", ["cpu", "accelerator"])
@pytest.mark.parametrize("backend", ["userstreams", "userstreams_aot_eager"])
@pytest.mark.parametrize("construct", sorted(CONSTRUCTS))
def test_streams_inside_subgraphs_give_eagers_gradients(
    construct: str, backend: str, device: str
) -> None:
    fn = CONSTRUCTS[construct]
    x, w = torch.rand(4, requires_grad=True), torch.rand(4, requires_grad=True)
    ex, ew = (t.detach().clone().requires_grad_() for t in (x, w))
    with side_stream(device) as s:
        torch.compile(fn, backend=backend)(x, w, s).backward()
        fn(ex, ew, s).backward()
    torch.testing.assert_close((x.grad, w.grad), (ex.grad, ew.grad))
