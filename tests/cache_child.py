"""Run by ``test_caches.py`` in a fresh process: train a stream step with ``userstreams``.

Prints one JSON line: the cache counters of the run, and whether the gradients matched
eager and every call synced its own streams. The parent runs it twice with one Inductor
cache directory, so the second run reads what the first wrote.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable

import torch
from helpers import two_stream_step as step

import torch_userstreams
from torch_userstreams.simulator import SimStream
from torch_userstreams.testing.fake_accelerator import FakeAcceleratorStream, fake_accelerator


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def train(
    make_stream: Callable[[], torch.Stream], syncs_logged: bool, regions: bool = False
) -> tuple[bool, bool]:
    """Three calls with fresh inputs and streams: (gradients as eager, own streams synced);
    ``regions`` asks for them where torch 2.12+ compiles one call per graph."""
    torch._dynamo.reset()
    options = {"userstreams.one_call": False} if regions else None
    compiled = torch.compile(step, backend="userstreams", options=options)
    grads_ok, objects_ok = True, True
    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        x = torch.rand(8, generator=generator, requires_grad=True)
        w = torch.rand(8, generator=generator, requires_grad=True)
        s1, s2 = make_stream(), make_stream()
        compiled(x, w, s1, s2).backward()
        ex, ew = (t.detach().clone().requires_grad_() for t in (x, w))
        ((ex * ew).sin() * ew + ex).sum().backward()
        grads_ok &= torch.allclose(x.grad, ex.grad) and torch.allclose(w.grad, ew.grad)
        if syncs_logged:
            objects_ok &= s2.log == [("wait_stream", s1)] and s1.log == [("wait_stream", s2)]
    return grads_ok, objects_ok


def main() -> None:
    from torch._dynamo.utils import counters

    records = _Records()
    logging.getLogger("torch_userstreams").addHandler(records)
    logging.getLogger("torch_userstreams").setLevel(logging.INFO)
    torch_userstreams.install()
    # CPU: one call per graph on 2.12+, with no sync left to pin, so Inductor caches it.
    cpu = train(lambda: SimStream(device="cpu"), syncs_logged=False)
    with fake_accelerator():
        regions = train(FakeAcceleratorStream, syncs_logged=True, regions=True)
        # The default: one call per graph (2.12+: each sync pinned by a ``control_deps``).
        one_call = train(FakeAcceleratorStream, syncs_logged=True)
    grads_ok = cpu[0] and regions[0] and one_call[0]
    objects_ok = regions[1] and one_call[1]
    report = {
        "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
        "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
        "fxgraph_cache_bypass": counters["inductor"]["fxgraph_cache_bypass"],
        "autograd_cache_hit": counters["aot_autograd"]["autograd_cache_hit"],
        "grads_ok": grads_ok,
        "objects_ok": objects_ok,
        "bypass_logged": any("bypasses AOTAutograd's cache" in m for m in records.messages),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    sys.exit(main())
