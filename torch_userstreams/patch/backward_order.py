"""Keep a backward's syncs when the min-cut partitioner reorders the backward graph.

After it extracts the backward graph, the min-cut partitioner (``userstreams``) rebuilds it
in the order the autograd engine would run it (``reordering_to_mimic_autograd_engine``):
it starts at the first node that reads a tangent and keeps only what follows it and what
that needs. A sync reads no tensor, so one that comes before every tangent use was dropped:
a custom ``autograd.Function`` whose output the compiled function returns runs its backward
first, and the ``record``/``wait`` at the top of that backward never ran. On a GPU, the
gradient work after the lost wait raced the stream it waited for.

The replacement runs the native reordering and counts the syncs on both sides: when some
went missing it keeps the partitioner's own order (the joint graph's, a valid topological
order that at worst keeps recomputed forward values alive longer). Graphs without syncs,
and graphs whose syncs survive, get the native result.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.fx

from ..fx.control_deps import is_control_deps
from ..fx.ops import is_sync_op
from ..originals import carries

Reordering = Callable[[torch.fx.GraphModule], torch.fx.GraphModule]


def _syncs(gm: torch.fx.GraphModule) -> int:
    return sum(
        1
        for node in gm.graph.nodes
        if node.op == "call_function" and (is_sync_op(node.target) or is_control_deps(node))
    )


def wrap_reordering(native: Reordering) -> Reordering:
    """The replacement: ``native``'s graph unless it lost a sync, else ``gm`` unchanged."""

    @carries(native)
    def reordering_to_mimic_autograd_engine(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        reordered = native(gm)
        return reordered if _syncs(reordered) == _syncs(gm) else gm

    return reordering_to_mimic_autograd_engine
