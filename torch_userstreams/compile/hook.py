"""The OutputGraph hook: a compile per graph, its prologue generated after the backend returns.

Wraps ``OutputGraph.compile_and_call_fx_graph``. Before the backend sees Dynamo's graph, the
graph's syncs get the shape of later torch releases (``method_syncs``) and its stream
annotations are checked against its table. While the original runs (Dynamo calls the backend
inside it), every request lands in this graph's compile. When it returns, the backend is
done, so the table is complete: the compiled function is wrapped in a ``BoundGraph`` and the
prologue prepended to the instructions that call it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ..errors import UnsupportedPathError, UserObjectError, compiled_autograd_hint
from ..originals import carries
from ..run.backward import attach
from ..run.bound_graph import BoundGraph
from ..run.state import state
from . import graph_compile, method_syncs, prologue
from .contract import Rewritten, TracedGraph, run_passes
from .graph_compile import GraphCompile
from .load_plan import plan_loads
from .table import HandOver, UserObjectTable

log = logging.getLogger("torch_userstreams")

COMPILED_FN_PREFIX = "__compiled_fn"


def _compiled_fn_name(instructions: list[Any]) -> str:
    for inst in reversed(instructions):
        if inst.opname == "LOAD_GLOBAL" and str(inst.argval).startswith(COMPILED_FN_PREFIX):
            return str(inst.argval)
    raise UserObjectError(
        "torch_userstreams: could not find the compiled graph's call in the bytecode Dynamo "
        "generated; this torch version's OutputGraph changed. Run "
        "`python -m torch_userstreams doctor` and report the output."
    )


def _check_no_specializations(output_graph: Any, table: UserObjectTable) -> None:
    shape_env = getattr(output_graph, "shape_env", None)
    if getattr(shape_env, "specializations", None):
        raise UnsupportedPathError(
            f"torch_userstreams: graph {table.graph_name} uses user streams/events and "
            "backend specializations (torch.compile(..., dynamic=...) with "
            "mark_dynamic(specialize_on=...)); the specialized graphs are compiled at run "
            "time, after the prologue exists, so their objects could not be bound. Drop the "
            "specialization or uninstall torch_userstreams for this function."
        )


def _check_native_tables_empty(table: UserObjectTable) -> None:
    from torch._dynamo import graph_bytecode_inputs as native

    if native.index_to_bytecode_constructor:
        raise UserObjectError(
            f"torch_userstreams: while compiling graph {table.graph_name} something "
            "registered a user object in native Dynamo's global table, bypassing the "
            "package. A patch point was missed for this torch version; run "
            "`python -m torch_userstreams doctor` and report the output."
        )


def check_streams(graph: torch.fx.Graph, table: UserObjectTable) -> None:
    """Every stream annotation of ``graph`` names a stream of its own ``table``.

    An annotation that does not (copied from a graph module traced before, such as a strict
    ``torch.export``'s, or left by a failed trace) would run the node on some other call's
    object, or fail deep inside a backend.
    """
    from ..fx.meta import stream_of

    for node in graph.nodes:
        index = stream_of(node)
        if index is None:
            continue
        known = 0 <= index < len(table)
        if not known or not isinstance(table.entries[index].example, torch.Stream):
            what = table.entries[index].describe().strip() if known else "nothing"
            prefix = (
                f"torch_userstreams: node {node.name} of graph {table.graph_name} is "
                f"annotated to run on stream {index}"
            )
            hint = compiled_autograd_hint()
            if hint:
                raise UserObjectError(f"{prefix}, which is not in its table.{hint}")
            raise UserObjectError(
                f"{prefix}, but entry {index} of its table is {what}: no stream of this "
                "trace made that annotation. A graph module traced before (the module of a "
                "strict torch.export, or any FX GraphModule) keeps its nodes' stream "
                "annotations (node.meta['custom']['stream']) when compiled again, without "
                "the streams they named: compile the original module, export with "
                "strict=False, or drop them first (for node in gm.graph.nodes: "
                "node.meta.get('custom', {}).pop('stream', None)). Otherwise a failed trace "
                "left it: call torch._dynamo.reset(), compile again, and report it if it "
                "recurs."
            )


def _check_requested(used: set[int], table: UserObjectTable) -> None:
    """Every index the frame's graph (and its subgraphs) reads once the backend ran must be
    in its table. An index a backend wrote without requesting it here would resolve, inside
    another compiled call, against that call's objects, since a graph with an empty table
    binds nothing. Graphs the backend makes itself (AOTAutograd's forward and backward) are
    not seen here; their lookups are checked per call against the table's size only."""
    unknown = sorted(index for index in used if not 0 <= index < len(table))
    if not unknown:
        return
    prefix = (
        f"torch_userstreams: graph {table.graph_name} reads user object(s) "
        f"{', '.join(map(str, unknown))} after its backend ran, but its table has "
        f"{len(table)} entries."
    )
    hint = compiled_autograd_hint()  # its retraced backward names the forward's entries
    if hint:
        raise UserObjectError(prefix + hint)
    raise UserObjectError(
        f"{prefix} A backend must request each object it reads while this graph compiles: "
        "torch_userstreams.new_stream(), new_event() or current_stream() return the index "
        "to use."
    )


def _bind(compiled: Callable[..., Any], table: UserObjectTable) -> tuple[Any, BoundGraph]:
    """Wrap the compiled function, keeping Dynamo's ``disable`` outermost.

    Dynamo installs the graph as ``disable(fn)`` so that its frames are never traced; the
    ``BoundGraph`` goes inside that wrapper, or Dynamo would try to compile the run-time layer.
    """
    from torch._dynamo import disable
    from torch._dynamo.eval_frame import innermost_fn

    hand_over = HandOver.WHILE_FOUND if table.plan is None else table.plan.hand_over
    bound = BoundGraph(
        innermost_fn(compiled),
        table,
        None if hand_over is HandOver.NONE else attach,
        stops_handing_over=hand_over is HandOver.WHILE_FOUND,
    )
    return disable(bound.run, reason="torch_userstreams: runs a compiled graph"), bound


def finish(output_graph: Any, compile_: GraphCompile, result: Any) -> Any:
    """Wrap the compiled function and prepend the prologue, if the graph loads any object."""
    table = compile_.table
    _check_native_tables_empty(table)
    if getattr(output_graph, "export", False):
        state.calls.exported = table  # keeps its examples for export's re-trace
    else:
        table.release_examples()
    used = prologue.read_by(prologue.graphs_of(output_graph))
    _check_requested(used, table)
    table.plan = plan_loads(
        table, used, compile_.reported_reads, backward_traced=compile_.backward_traced
    )
    if not table.plan.loads_any:
        return result
    _check_no_specializations(output_graph, table)
    instructions = result[0] if isinstance(result, tuple) else result
    name = _compiled_fn_name(instructions)
    output_graph.global_scope[name], bound = _bind(output_graph.global_scope[name], table)
    compile_.bound = bound
    bound.returns_objects = compile_.returns_objects
    code = prologue.build(output_graph, table, bound)
    table.prologue_listing = prologue.render(code)
    log.debug("%s\nprologue:\n%s", table.describe(), table.prologue_listing)
    _trace(table)
    graph_compile.collected(table)
    if isinstance(result, tuple):
        return (code + list(result[0]), *result[1:])
    return code + list(result)


def _trace(table: UserObjectTable) -> None:
    """The table, what the passes did and the prologue as an artifact of ``TORCH_TRACE``'s
    structured log, so tlparse shows them beside Dynamo's own (free without a trace)."""
    from torch._logging import trace_structured

    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": "torch_userstreams_table", "encoding": "string"},
        payload_fn=lambda: f"{table.describe()}\nprologue:\n{table.prologue_listing}",
    )


def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement for ``OutputGraph.compile_and_call_fx_graph``."""

    @carries(original)
    def compile_and_call_fx_graph(self: Any, *args: Any, **kwargs: Any) -> Any:
        compile_ = graph_compile.for_output_graph(self)
        traced: list[Rewritten] = [TracedGraph(self.graph), *prologue.subgraph_modules(self)]
        for graph in traced:  # a checkpointed body's syncs too
            run_passes(graph, (method_syncs.PASS,), compile_)
        check_streams(self.graph, compile_.table)
        with graph_compile.backend_running(compile_):
            result = original(self, *args, **kwargs)
        graph_compile.graph_compiled()
        return finish(self, compile_, result)

    return compile_and_call_fx_graph
