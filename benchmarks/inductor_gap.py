"""Where Inductor itself loses to eager on the CPU demo: evidence for the demo rows.

On CPU the package hands Inductor the demo's graph whole, without syncs (as one graph
without streams, or, on torch 2.12+, as one call on its streams, which fuses nothing across
two streams and pays a lookup per call), so the package's steps/s follow Inductor's. Two
measurements say why Inductor on the model alone is
below eager at the demo's size (dim 64, batch 64, one thread), and a third what any compiled
training call costs (the demo compiles its loss with its model, which puts it above eager):

* ``mask_rows``: Inductor's CPU kernel that writes a 1-byte mask (``x <= 0``, the
  mask the relu backward needs) against the same kernel writing the mask as float32, and
  the relu backward's ``where`` reading that mask against comparing the float activation.
  The training forward saves such a mask per relu (eager saves the activation); on AVX2
  the store goes through a per-lane branching conversion
  (``VecMask<float,1>::store(bool*)``), tens of microseconds per 4,096 elements where the
  float store takes about one; reading the mask back costs less (1.0-1.4x comparing the
  floats, per call, in two runs).
* ``recompute_bool_masks``: a joint-graph pass that marks every bool node for recompute, so
  the partitioner saves the float activation instead and the backward recomputes the mask
  in registers. Used only for a diagnostic contender in ``demo_speed``; the package never
  changes what Inductor saves.
* ``call_cost_rows``: what torch's compiled-call path costs per training call, whatever
  the backend: one ``Linear(64, 1)``, eager against Inductor, so its kernel time is the
  same and the difference is the fixed cost (Dynamo's guards, AOTAutograd's runtime
  wrappers, its autograd Function, the generated wrapper). A step pays it once per
  forward and once per backward; at dim 64 the fused kernels of the model compiled alone
  save less than that.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.utils.checkpoint import CheckpointPolicy

from .results import Row
from .timing import abba, median, per_call_ns, warm_up

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


def _compiled_call_us(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> float:
    compiled = torch.compile(fn, backend="inductor")
    warm_up(compiled, args, 200)
    return median([per_call_ns(compiled, args, 500) for _ in range(7)]) / 1_000


def _mask_row(case: str, reference_us: float, bool_us: float, note: str) -> Row:
    return Row(
        BENCH,
        case,
        reference_us,
        bool_us,
        "us",
        ratio=bool_us / reference_us,
        details={"note": f"whole compiled calls; the difference is {note}"},
    )


def mask_rows() -> list[Row]:
    """us per call of Inductor kernels that write, then read, a 64x64 relu mask as bool,
    against the same kernels on float32: what the demo's relu backward costs compiled."""
    x, grad = torch.randn(64, 64), torch.randn(64, 64)
    as_float = _compiled_call_us(lambda t: (t <= 0).float(), x)
    as_bool = _compiled_call_us(lambda t: t <= 0, x)
    from_compare = _compiled_call_us(lambda g, t: torch.where(t <= 0, 0.0, g), grad, x)
    from_mask = _compiled_call_us(lambda g, m: torch.where(m, 0.0, g), grad, x <= 0)
    return [
        _mask_row(
            "inductor cpu kernel, 64x64 relu mask: stored as bool over as float32 (reference)",
            as_float,
            as_bool,
            "the store",
        ),
        _mask_row(
            "inductor cpu kernel, relu backward: reading a bool mask over comparing floats "
            "(reference)",
            from_compare,
            from_mask,
            "reading the mask",
        ),
    ]


def _forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x)


def _forward_backward(model: torch.nn.Module, x: torch.Tensor) -> None:
    model(x).sum().backward()


def call_cost_rows(rounds: int) -> list[Row]:
    """us per training call of one ``Linear(64, 1)`` on a 64x64 input (parameters requiring
    grad), compiled with Inductor over eager, forward alone and forward plus backward;
    eager and compiled take turns (ABBA)."""
    torch.manual_seed(0)
    model, x = torch.nn.Linear(64, 1), torch.randn(64, 64)
    models = {"eager": model, "inductor": torch.compile(model, backend="inductor")}
    rows = []
    for what, step in (("forward", _forward), ("forward and backward", _forward_backward)):
        for name in models:
            warm_up(step, (models[name], x), 200)
        samples: dict[str, list[float]] = {name: [] for name in models}
        for pair in abba("eager", "inductor", rounds):
            for name in pair:
                samples[name].append(per_call_ns(step, (models[name], x), 500) / 1_000)
        eager, inductor = median(samples["eager"]), median(samples["inductor"])
        case = f"cpu training call, one Linear(64, 1), {what}: inductor over eager (reference)"
        note = f"the fixed cost of a compiled call: {inductor - eager:.1f} us more than eager"
        rows.append(
            Row(BENCH, case, eager, inductor, "us", ratio=inductor / eager, details={"note": note})
        )
    return rows
