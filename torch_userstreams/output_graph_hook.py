"""The OutputGraph hook: table per graph, prologue generated after the backend returns.

Wraps ``OutputGraph.compile_and_call_fx_graph``. While the original runs (Dynamo calls the
backend inside it), every registration lands in this graph's table. When it returns, the
backend is done, so the table is complete: we wrap the compiled function in a
``BoundGraph`` and prepend the prologue to the instructions that call it.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from . import backward, epilogue, prologue, registration, runtime, sync_calls
from .errors import UnsupportedPathError, UserObjectError
from .passes.annotations import check_streams
from .table import UserObjectTable

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


def _bind(compiled: Callable[..., Any], table: UserObjectTable) -> tuple[Any, runtime.BoundGraph]:
    """Wrap the compiled function, keeping Dynamo's ``disable`` outermost.

    Dynamo installs the graph as ``disable(fn)`` so that its frames are never traced; the
    ``BoundGraph`` goes inside that wrapper, or Dynamo would try to compile our runtime.
    """
    from torch._dynamo import disable
    from torch._dynamo.eval_frame import innermost_fn

    bound = runtime.BoundGraph(innermost_fn(compiled), table, backward.attach)
    return disable(bound.run, reason="torch_userstreams: runs a compiled graph"), bound


def finish(output_graph: Any, table: UserObjectTable, result: Any, lookup_targets: tuple) -> Any:
    """Wrap the compiled function and prepend the prologue, if the graph has objects."""
    _check_native_tables_empty(table)
    if getattr(output_graph, "export", False):
        runtime.set_exported(table)  # keeps its examples for export's re-trace
    else:
        table.release_examples()
    prologue.mark_live(table, output_graph.graph, lookup_targets)
    if not table:
        return result
    _check_no_specializations(output_graph, table)
    instructions = result[0] if isinstance(result, tuple) else result
    name = _compiled_fn_name(instructions)
    output_graph.global_scope[name], bound = _bind(output_graph.global_scope[name], table)
    vars(output_graph)[epilogue.BOUND_ATTR] = bound
    bound.returns_objects = bool(vars(output_graph).get(epilogue.RETURNS_ATTR))
    code = prologue.build(output_graph, table, bound)
    table.prologue_listing = prologue.render(code)
    log.debug("%s\nprologue:\n%s", table.describe(), table.prologue_listing)
    explain_sink = registration.explain_sink()
    if explain_sink is not None:
        explain_sink.append(table)
    if isinstance(result, tuple):
        return (code + list(result[0]), *result[1:])
    return code + list(result)


def wrap(original: Callable[..., Any], lookup_targets: tuple[Any, ...]) -> Callable[..., Any]:
    """The replacement for ``OutputGraph.compile_and_call_fx_graph``."""

    @functools.wraps(original)
    def compile_and_call_fx_graph(self: Any, *args: Any, **kwargs: Any) -> Any:
        table = registration.table_of(self)
        sync_calls.rewrite(self.graph, lookup_targets, table)
        check_streams(self.graph, table)
        with registration.compiling(self):
            result = original(self, *args, **kwargs)
        table = registration.take_table(self)
        return finish(self, table, result, lookup_targets)

    compile_and_call_fx_graph.__torch_userstreams_original__ = original  # type: ignore[attr-defined]
    return compile_and_call_fx_graph
