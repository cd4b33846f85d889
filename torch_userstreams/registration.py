"""Where registrations land: always the table of the graph being traced or compiled.

Native Dynamo registers user objects into process-global tables. Our replacements for its
registration functions (installed by ``patching``) put every entry into the table of the
graph at hand instead:

* while a backend compiles a graph, the graph on this thread's compile stack
  (``compiling``, pushed by the OutputGraph hook);
* while Dynamo traces, the OutputGraph of the current instruction translator;
* before the translator exists (Dynamo registers the ambient current stream in the
  translator's constructor), a thread-local staging table that the translator's graph
  adopts the first time it asks.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from .errors import NotCompilingError
from .table import UserObjectTable

TABLE_ATTR = "_torch_userstreams_table"


class _CompileState(threading.local):
    def __init__(self) -> None:
        self.compiling: list[Any] = []  # OutputGraphs whose backend is running
        self.staging: UserObjectTable | None = None
        self.explain_sink: list[UserObjectTable] | None = None


_compile_state = _CompileState()


def graph_name(output_graph: Any) -> str:
    """A stable, readable name: the frame's function and Dynamo's compile id."""
    compile_id = getattr(output_graph, "compile_id", None)
    try:
        code = output_graph.root_tx.f_code
        where = f"{code.co_name}"
    except AttributeError:
        where = "<frame>"
    try:
        from torch._guards import CompileContext

        ctx_id = CompileContext.current_compile_id()
        if ctx_id is not None:
            return f"{where} [{ctx_id}]"
    except Exception:  # pragma: no cover - naming must never break a compile
        pass
    return f"{where} [c{compile_id}]"


def table_of(output_graph: Any) -> UserObjectTable:
    """The table of ``output_graph``, created (or adopted from staging) on first use."""
    table = output_graph.__dict__.get(TABLE_ATTR)
    if table is None:
        table = _compile_state.staging or UserObjectTable()
        _compile_state.staging = None
        table.graph_name = graph_name(output_graph)
        output_graph.__dict__[TABLE_ATTR] = table
    return table


def take_table(output_graph: Any) -> UserObjectTable:
    """Detach the table from the graph: the next backend compile of it starts afresh."""
    table = table_of(output_graph)
    del output_graph.__dict__[TABLE_ATTR]
    return table


def _current_translator_output() -> Any:
    from torch._dynamo import symbolic_convert

    tx = getattr(symbolic_convert.tls, "current_tx", None)
    return None if tx is None else tx.output


def current_table() -> UserObjectTable:
    """The table a registration made right now belongs to (see the module docstring)."""
    table = table_if_compiling()
    if table is not None:
        return table
    if _compile_state.staging is None:
        _compile_state.staging = UserObjectTable()
    return _compile_state.staging


def compiling_table(api_name: str) -> UserObjectTable:
    """The table of the graph whose backend is compiling; an error outside a compile."""
    table = table_if_compiling()
    if table is not None:
        return table
    raise NotCompilingError(
        f"torch_userstreams.{api_name}() was called outside a compile. It requests an "
        "object for the graph being compiled, so call it from a backend (or a pass it runs) "
        "while torch.compile is compiling, with torch_userstreams installed."
    )


@contextlib.contextmanager
def compiling(output_graph: Any) -> Iterator[None]:
    """Route registrations to ``output_graph`` while its backend runs."""
    stack = _compile_state.compiling
    stack.append(output_graph)
    try:
        yield
    finally:
        stack.pop()


def reset_staging() -> None:
    """A new frame compile starts: forget objects staged for a graph that never came."""
    _compile_state.staging = None


def table_if_compiling() -> UserObjectTable | None:
    """The table of the graph traced or compiled on this thread right now, if any."""
    if _compile_state.compiling:
        return table_of(_compile_state.compiling[-1])
    output = _current_translator_output()
    return None if output is None else table_of(output)


def explain_sink() -> list[UserObjectTable] | None:
    """Where ``explain()`` collects the tables of the graphs compiled on this thread."""
    return _compile_state.explain_sink


@contextlib.contextmanager
def collecting_tables() -> Iterator[list[UserObjectTable]]:
    previous = _compile_state.explain_sink
    sink: list[UserObjectTable] = []
    _compile_state.explain_sink = sink
    try:
        yield sink
    finally:
        _compile_state.explain_sink = previous


def is_compiling_with_package() -> bool:
    """True while our OutputGraph hook runs a backend on this thread."""
    return bool(_compile_state.compiling)
