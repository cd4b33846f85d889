"""The package's joint-graph passes, device-agnostic (no accelerator, no triton).

``patch`` installs the entry points below in place of AOTAutograd's functions of the same
names (``_aot_autograd/streams.py``), which AOTAutograd calls on the joint graph, in this
order. Each rule lives in its own module, as a ``GraphPass`` that states what it requires
and ensures (``contract``); the entry points run them on the compile whose backend runs.

    assign_backward_streams   backward_phase, write_backs, inherit_streams, grad_accumulation
    insert_backward_syncs     backward_syncs
    sync_deallocations        dealloc_syncs, pin_syncs (the last pass on every torch)
    wrap_all_sync_nodes_...   sync_ordering (torch >= 2.12; forward-only graphs too, after
                              their dealloc_syncs)

On torch 2.11 AOTAutograd calls no stream pass on a forward-only graph: the package's
backends run ``sync_inference_graph_in_backend`` on it when they compile it.
"""

from __future__ import annotations

import torch.fx

from ..compile import graph_compile
from ..compile.contract import Fact, GraphPass, ensure, run_passes
from ..fx.meta import is_tangent, stream_of
from ..fx.ops import is_sync_op
from . import (
    backward_phase,
    backward_syncs,
    dealloc_syncs,
    grad_accumulation,
    inherit_streams,
    sync_ordering,
    write_backs,
)


def _has_streams(gm: torch.fx.GraphModule) -> bool:
    return any(stream_of(node) is not None for node in gm.graph.nodes)


def _has_syncs(gm: torch.fx.GraphModule) -> bool:
    return any(is_sync_op(node.target) for node in gm.graph.nodes)


def _run(gm: torch.fx.GraphModule, passes: tuple[GraphPass, ...], needed: bool) -> None:
    """Run ``passes`` on the graph's compile when ``needed``; otherwise their facts hold
    vacuously (AOTAutograd also compiles graphs outside Dynamo, with nothing to do here)."""
    if needed:
        run_passes(gm, passes, graph_compile.active_or_none())
    else:
        ensure(gm, *(fact for p in passes for fact in p.ensures))


def assign_backward_streams(gm: torch.fx.GraphModule) -> None:
    """Replaces AOTAutograd's pass: tag what a custom backward traced (so a write-back is
    not placed among it), write inputs back where they were updated, inherit forward
    streams, then place accumulations."""
    compile_ = graph_compile.active_or_none()
    if compile_ is not None:  # the graph's calls will make AOTAutograd's Python node
        compile_.backward_traced = True
    _run(gm, (backward_phase.PASS,), _has_streams(gm) or _has_syncs(gm))
    _run(gm, (write_backs.PASS, inherit_streams.PASS, grad_accumulation.PASS), _has_streams(gm))


def insert_backward_syncs(gm: torch.fx.GraphModule) -> None:
    """Replaces AOTAutograd's pass (which skips CPU values)."""
    _run(gm, (backward_syncs.PASS,), _has_streams(gm))


def sync_deallocations(gm: torch.fx.GraphModule) -> None:
    """Replaces AOTAutograd's pass (which needs triton and GPU bandwidth estimates)."""
    _run(gm, (dealloc_syncs.PASS,), _has_streams(gm))
    _run(gm, (sync_ordering.PIN,), _has_syncs(gm))


def _is_joint(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` is a joint graph: it takes tangents. A backward tag does not tell: an
    inference graph's epilogue copy into a mutated input is tagged ``must_be_in_backward``."""
    return any(is_tangent(node) for node in gm.graph.nodes)


def sync_inference_deallocations(gm: torch.fx.GraphModule) -> None:
    """Sync a forward-only (inference) graph's deallocations, as a training graph's forward
    is: AOTAutograd calls none of the passes above on such a graph."""
    ensure(gm, Fact.BACKWARD_READS_SYNCED)
    # Its events need a compile to hold them: export's decompositions reach this too.
    in_compile = graph_compile.active_or_none() is not None
    _run(gm, (write_backs.PASS, dealloc_syncs.PASS), in_compile and _has_streams(gm))
    ensure(gm, Fact.SYNCS_COMPLETE)


def wrap_all_sync_nodes_with_control_deps(gm: torch.fx.GraphModule) -> None:
    """Replaces AOTAutograd's wrapping, which mixes forward and backward dependencies. It is
    the one stream pass AOTAutograd also calls on an inference graph (torch 2.12+): that
    graph's deallocations are synced here first."""
    if not _is_joint(gm):
        sync_inference_deallocations(gm)
    _run(gm, (sync_ordering.WRAP,), _has_syncs(gm))


def aot_syncs_inference_graphs() -> bool:
    """Whether this torch's AOTAutograd calls a stream pass on inference graphs (2.12+).
    Where it does not (2.11), the package's backends sync them when they compile them."""
    from torch._functorch._aot_autograd import streams

    return hasattr(streams, "wrap_all_sync_nodes_with_control_deps")


def sync_inference_graph_in_backend(gm: torch.fx.GraphModule) -> None:
    """What a package backend runs on an inference graph before compiling it: the
    deallocation syncs AOTAutograd 2.11 never asked for (a no-op where it did)."""
    if not aot_syncs_inference_graphs():
        sync_inference_deallocations(gm)
