"""Where Inductor itself loses to eager on the CPU demo: evidence for the demo rows.

On CPU the package hands Inductor the demo's graph whole, without syncs, so the package's
steps/s can only be Inductor's. Two measurements say why that is below eager at the demo's
size (dim 64, batch 64, one thread):

* ``mask_store_rows``: Inductor's CPU kernel that writes a 1-byte mask (``x <= 0``, the
  mask the relu backward needs) against the same kernel writing the mask as float32. The
  training forward saves such a mask per relu; on AVX2 that store goes through a per-lane
  branching conversion (``VecMask<float,1>::store(bool*)``), tens of microseconds per 4,096
  elements where the float store takes about one.
* ``recompute_bool_masks``: a joint-graph pass that marks every bool node for recompute, so
  the partitioner saves the float activation instead and the backward recomputes the mask
  in registers. Used only for a diagnostic contender in ``demo_speed``; the package never
  changes what Inductor saves.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.utils.checkpoint import CheckpointPolicy

from .results import Row
from .timing import median, per_call_ns, warm_up

BENCH = "demo"


class RecomputeBoolMasks(CustomGraphPass):
    """An Inductor joint pass marking bool-valued nodes MUST_RECOMPUTE. A CustomGraphPass
    with a uuid, so Inductor's caches key on it instead of bypassing."""

    def __call__(self, graph: torch.fx.Graph) -> None:
        for node in graph.nodes:
            value = node.meta.get("val")
            if node.op == "call_function" and isinstance(value, torch.Tensor):
                if value.dtype == torch.bool:
                    node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE

    def uuid(self) -> str:
        return "torch_userstreams.benchmarks.recompute_bool_masks.v1"


recompute_bool_masks = RecomputeBoolMasks()


def compile_with_masks_recomputed(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``torch.compile`` with Inductor and ``recompute_bool_masks``, as its own backend.

    The pass goes in the backend's options, not in a config patch around the first call:
    Dynamo keeps compiled code per code object, so a second model of a class already
    compiled with plain Inductor would reuse that graph, bool masks and all, and the
    contender would measure plain Inductor under another name. A backend of its own
    fails Dynamo's backend guard, so it compiles afresh.
    """
    options = {"joint_custom_post_pass": recompute_bool_masks}
    return torch.compile(fn, backend="inductor", options=options)


def _compiled_call_us(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> float:
    compiled = torch.compile(fn, backend="inductor")
    warm_up(compiled, (x,), 200)
    return median([per_call_ns(compiled, (x,), 500) for _ in range(7)]) / 1_000


def mask_store_rows() -> list[Row]:
    """us per call of Inductor's ``x <= 0`` stored as bool against stored as float32."""
    x = torch.randn(64, 64)
    as_float = _compiled_call_us(lambda t: (t <= 0).float(), x)
    as_bool = _compiled_call_us(lambda t: t <= 0, x)
    return [
        Row(
            BENCH,
            "inductor cpu kernel, 64x64 relu mask: stored as bool over as float32 (reference)",
            as_float,
            as_bool,
            "us",
            ratio=as_bool / as_float,
            details={"note": "whole compiled calls; the difference is the store"},
        )
    ]
