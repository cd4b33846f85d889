"""Every torch internal we patch, per supported torch minor version, in one place.

Each ``PatchPoint`` names where the native object lives, what we expect there (its
parameter names) and what replaces it. ``aliases=True`` means modules imported the object
by value (``from x import f``); ``patch.install`` finds those copies by identity and patches
them too. ``tests/golden/`` freezes the signature of each point per version, so an upstream
change shows up as one failing test.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import passes
from ..compile import hook
from ..compile.returned_objects import wrap_reconstruct
from ..inductor import launch_code, pattern_streams, placed_streams, sync_order
from ..run.lookup import lookup
from . import (
    backward_order,
    cse,
    event_stream_arg,
    keyword_args,
    queries,
    replacements,
    stream_blocks,
)

SUPPORTED_MINORS = ("2.11", "2.12", "2.13", "2.14", "2.15")
SUPPORTED_RANGE = ">=2.11,<2.16"

GBI = "torch._dynamo.graph_bytecode_inputs"
STREAMS = "torch._dynamo.variables.streams"
OUTPUT_GRAPH = "torch._dynamo.output_graph"
AOT_STREAMS = "torch._functorch._aot_autograd.streams"
PATTERN_MATCHER = "torch._inductor.pattern_matcher"
PARTITIONERS = "torch._functorch.partitioners"
SCHEDULER = "torch._inductor.scheduler"
LOWERING = "torch._inductor.graph"


@dataclass(frozen=True)
class PatchPoint:
    """One attribute we replace: ``module.qualname`` (``qualname`` may be ``Class.attr``)."""

    module: str
    qualname: str
    replacement: Callable[..., Any]  # or, with ``wraps``, a factory given the native
    params: tuple[str, ...]  # parameter names we expect the native object to take
    aliases: bool = True
    static: bool = False  # a staticmethod in a class: restore the descriptor itself
    wraps: bool = False  # the replacement is a factory called with the native object
    # Other names the replacement relies on in ``module``: missing ones fail the install.
    needs: tuple[str, ...] = ()
    # A class attribute holding a dict of handlers by method name (Dynamo's ``tp_methods``,
    # torch 2.14+) that holds the native under ``attr``: the dict is replaced too, by a copy
    # whose entry wraps the replacement.
    table: str | None = None

    @property
    def name(self) -> str:
        return f"{self.module}.{self.qualname}"


_COMMON = (
    PatchPoint(GBI, "register_user_object", replacements.register_user_object, ("value", "source")),
    PatchPoint(
        GBI,
        "register_graph_created_object",
        replacements.register_graph_created_object,
        ("example_value", "construct_fn"),
    ),
    PatchPoint(GBI, "get_external_object_by_index", lookup, ("index",)),
    PatchPoint(GBI, "reset_user_object_tracking", replacements.wrap_reset, (), wraps=True),
    PatchPoint(GBI, "has_user_objects", replacements.has_user_objects, ()),
    PatchPoint(STREAMS, "new_event", replacements.new_event, ("args", "kwargs")),
    PatchPoint(STREAMS, "new_stream", replacements.new_stream, ("args", "kwargs")),
    PatchPoint(STREAMS, "get_current_stream", replacements.get_current_stream, ("device",)),
    PatchPoint(
        STREAMS,
        "StreamVariable.make_construct_in_graph_stream_fn",
        replacements.make_construct_in_graph_stream_fn,
        ("args", "kwargs"),
        aliases=False,
        static=True,
    ),
    PatchPoint(
        STREAMS,
        "EventVariable.make_construct_in_graph_event_fn",
        replacements.make_construct_in_graph_event_fn,
        ("args", "kwargs"),
        aliases=False,
        static=True,
    ),
    PatchPoint(
        STREAMS,
        "StreamVariable.reconstruct",
        wrap_reconstruct,
        ("self", "codegen"),
        aliases=False,
        wraps=True,
    ),
    PatchPoint(
        STREAMS,
        "EventVariable.reconstruct",
        wrap_reconstruct,
        ("self", "codegen"),
        aliases=False,
        wraps=True,
    ),
    *(
        PatchPoint(
            STREAMS,
            f"StreamContextVariable.{handler}",
            getattr(stream_blocks, f"wrap_{handler}"),
            ("self", "tx", "args"),
            aliases=False,
            wraps=True,
        )
        for handler in ("enter", "exit")
    ),
    PatchPoint(
        STREAMS,
        "EventVariable._get_stream_arg",
        event_stream_arg.wrap_get_stream_arg,
        ("tx", "args", "kwargs"),
        aliases=False,
        static=True,
        wraps=True,
    ),
    PatchPoint(AOT_STREAMS, "assign_backward_streams", passes.assign_backward_streams, ("gm",)),
    PatchPoint(AOT_STREAMS, "insert_backward_syncs", passes.insert_backward_syncs, ("gm",)),
    PatchPoint(AOT_STREAMS, "sync_deallocations", passes.sync_deallocations, ("gm",)),
    PatchPoint(
        PATTERN_MATCHER,
        "same_mutation_regions",
        cse.wrap_same_mutation_regions,
        ("a", "b"),
        wraps=True,
    ),
    PatchPoint(
        PARTITIONERS,
        "reordering_to_mimic_autograd_engine",
        backward_order.wrap_reordering,
        ("gm",),
        wraps=True,
    ),
    PatchPoint(
        OUTPUT_GRAPH,
        "OutputGraph.compile_and_call_fx_graph",
        hook.wrap,
        ("self", "tx", "rv", "root"),
        aliases=False,
        wraps=True,
    ),
)

# Modules that hold by-value aliases but are imported lazily by torch: imported before the
# identity scan so that no copy is missed.
_LAZY_MODULES = (
    "torch._dynamo.variables.builder",
    "torch._dynamo.variables.user_defined",
    "torch._dynamo.variables.streams",
    "torch._dynamo.output_graph",
    "torch._dynamo.convert_frame",
    "torch._functorch._aot_autograd.streams",
    "torch._functorch._aot_autograd.graph_capture",
    "torch._functorch._aot_autograd.runtime_wrappers",
    "torch._higher_order_ops.invoke_leaf_function",
    "torch._inductor.cudagraph_trees",
    "torch._inductor.codegen.wrapper",
    "torch._inductor.scheduler",
)

# 2.12+ wrap sync nodes in control_deps after the stream passes (2.11 does not).
_WRAP_SYNCS = PatchPoint(
    AOT_STREAMS,
    "wrap_all_sync_nodes_with_control_deps",
    passes.wrap_all_sync_nodes_with_control_deps,
    ("gm",),
    needs=("_wrap_sync_node",),
)

# Inductor's code for a graph with user streams: its blocks and syncs on the call's objects
# (2.12+ Inductor enters the streams, and CPU code never defined them; 2.11 the package).
_STREAM_DEFINITIONS = PatchPoint(
    SCHEDULER,
    "Scheduler._codegen",
    launch_code.wrap_codegen,
    ("self", "nodes"),
    aliases=False,
    wraps=True,
)

# Inductor lets work after a wait_event move above it (``inductor.sync_order``).
_SYNC_FENCES = PatchPoint(
    SCHEDULER,
    "Scheduler._init",
    sync_order.wrap_init,
    ("self", "nodes"),
    aliases=False,
    wraps=True,
)

# 2.11 Inductor fuses nodes of any streams into one kernel (``inductor.placed_streams``).
_NO_CROSS_STREAM_FUSION = PatchPoint(
    SCHEDULER,
    "Scheduler.can_fuse",
    placed_streams.wrap_can_fuse,
    ("self", "node1", "node2", "can_reorder", "allow_mix_order_reduction"),
    aliases=False,
    wraps=True,
)

# 2.11 has no control_deps to compute what a sync must follow before it
# (``inductor.placed_streams.wrap_run_node``).
_REALIZED_BEFORE_SYNCS = PatchPoint(
    LOWERING,
    "GraphLowering.run_node",
    placed_streams.wrap_run_node,
    ("self", "n"),
    aliases=False,
    wraps=True,
)

# 2.11 Inductor's pattern matcher matches nodes of two streams (``inductor.pattern_streams``).
_NO_CROSS_STREAM_PATTERNS = PatchPoint(
    PATTERN_MATCHER,
    "get_mutation_region_id",
    pattern_streams.wrap_get_mutation_region_id,
    ("graph", "node"),
    wraps=True,
)

_STREAM_OF_REPLACEMENTS = PatchPoint(
    PATTERN_MATCHER,
    "ReplacementPatternEntry.replace_with_graph",
    pattern_streams.wrap_replace_with_graph,
    ("match", "graph", "replacement_graph", "args"),
    aliases=False,
    static=True,
    wraps=True,
)

# query() breaks the graph (``patch.queries``): through each class's call_method up to 2.13,
# through its tp_methods handler from 2.14.
_QUERY_BY_CALL_METHOD = tuple(
    PatchPoint(
        STREAMS,
        f"{cls}.call_method",
        queries.wrap_call_method,
        ("self", "tx", "name", "args", "kwargs"),
        aliases=False,
        wraps=True,
    )
    for cls in ("StreamVariable", "EventVariable")
)


def _handler_points(
    replacement: Callable[..., Any], handlers: tuple[str, ...]
) -> tuple[PatchPoint, ...]:
    """Points for ``Class.method`` handlers that Dynamo 2.14+ dispatches through the
    class's ``tp_methods`` table (each one's table entry is replaced too)."""
    return tuple(
        PatchPoint(
            STREAMS,
            handler,
            replacement,
            ("self", "tx", "args", "kwargs"),
            aliases=False,
            wraps=True,
            table="tp_methods",
        )
        for handler in handlers
    )


_QUERY_BY_TP_METHODS = _handler_points(
    queries.wrap_query, ("StreamVariable.query", "EventVariable.query")
)
# Stream methods called with their keyword trace as the positional call
# (``patch.keyword_args``): up to 2.13 the call_method replacement above does it.
_KEYWORDS_BY_TP_METHODS = _handler_points(
    keyword_args.wrap_tp_method,
    ("StreamVariable.record_event", "StreamVariable.wait_event", "StreamVariable.wait_stream"),
)

POINTS: dict[str, tuple[PatchPoint, ...]] = {
    "2.11": (
        *_COMMON,
        _STREAM_DEFINITIONS,
        _SYNC_FENCES,
        _NO_CROSS_STREAM_FUSION,
        _REALIZED_BEFORE_SYNCS,
        _NO_CROSS_STREAM_PATTERNS,
        _STREAM_OF_REPLACEMENTS,
        *_QUERY_BY_CALL_METHOD,
    ),
    "2.12": (*_COMMON, _WRAP_SYNCS, _STREAM_DEFINITIONS, _SYNC_FENCES, *_QUERY_BY_CALL_METHOD),
    "2.13": (*_COMMON, _WRAP_SYNCS, _STREAM_DEFINITIONS, _SYNC_FENCES, *_QUERY_BY_CALL_METHOD),
    "2.14": (
        *_COMMON,
        _WRAP_SYNCS,
        _STREAM_DEFINITIONS,
        _SYNC_FENCES,
        *_QUERY_BY_TP_METHODS,
        *_KEYWORDS_BY_TP_METHODS,
    ),
    "2.15": (
        *_COMMON,
        _WRAP_SYNCS,
        _STREAM_DEFINITIONS,
        _SYNC_FENCES,
        *_QUERY_BY_TP_METHODS,
        *_KEYWORDS_BY_TP_METHODS,
    ),
}
LAZY_MODULES: dict[str, tuple[str, ...]] = {minor: _LAZY_MODULES for minor in SUPPORTED_MINORS}
LAZY_MODULES["2.15"] = (*_LAZY_MODULES, "torch._dynamo.variables.memory")


def minor_of(version: str) -> str:
    """``"2.13.0+cpu"`` -> ``"2.13"``."""
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2])
