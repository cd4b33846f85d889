"""The package's own backward stream passes, device-agnostic (no accelerator, no triton).

``patching`` installs the three entry points below in place of AOTAutograd's passes of the
same names (``_aot_autograd/streams.py``), which AOTAutograd calls on the joint graph. Each
rule lives in its own module; see their docstrings.
"""

from __future__ import annotations

import torch.fx

from .backward_syncs import insert_backward_syncs as _insert_syncs
from .dealloc_syncs import sync_deallocations as _sync_deallocations
from .grad_accumulation import assign_accumulation_streams
from .inherit_streams import inherit_streams
from .sync_ordering import pin_syncs_to_their_phase, wrap_sync_nodes


def _has_streams(gm: torch.fx.GraphModule) -> bool:
    from .annotations import stream_of

    return any(stream_of(node) is not None for node in gm.graph.nodes)


def assign_backward_streams(gm: torch.fx.GraphModule) -> None:
    """Replaces AOTAutograd's pass: inherit forward streams, then place accumulations."""
    if _has_streams(gm):
        inherit_streams(gm)
        assign_accumulation_streams(gm)


def insert_backward_syncs(gm: torch.fx.GraphModule) -> None:
    """Replaces AOTAutograd's pass (which skips CPU values)."""
    if _has_streams(gm):
        _insert_syncs(gm)


def sync_deallocations(gm: torch.fx.GraphModule) -> None:
    """Replaces AOTAutograd's pass (which needs triton and GPU bandwidth estimates); the
    last of the joint-graph passes on every torch, so it also pins syncs to their phase."""
    if _has_streams(gm):
        _sync_deallocations(gm)
    pin_syncs_to_their_phase(gm)


def wrap_all_sync_nodes_with_control_deps(gm: torch.fx.GraphModule) -> None:
    """Replaces AOTAutograd's wrapping, which mixes forward and backward dependencies."""
    wrap_sync_nodes(gm)
