"""``explain()``: how many graphs a function compiles to, where it breaks, and what user
objects each graph has; with ``verbose``, each graph's prologue and what the passes did."""

from __future__ import annotations

import contextlib
import threading
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .compile.prologue_text import as_python
from .compile.table import UserObjectTable

LEGEND = """\
legend: [index] kind phase type origin (added by)
  input           loaded from the frame each call (an argument, a global, an attribute)
  graph-created   made by the function, a fresh object each call
  current-stream  the device's current stream when the call starts
  requested       made for the graph by a backend or a pass (a backward sync, a dealloc event)
  forward/backward  which graph reads it
  (unused: not loaded)  no compiled code reads it, so calls do not build it"""


@dataclass
class ExplainReport:
    """What compiling the function did: ``graphs`` (Dynamo's count), ``graph_breaks`` (each
    reason, in order), and the user-object ``tables`` of the graphs that have any."""

    tables: list[UserObjectTable] = field(default_factory=list)
    result: Any = None
    graphs: int = 0
    graph_breaks: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return self.text()

    def text(self, *, verbose: bool = False, bytecode: bool = False) -> str:
        """The report; ``verbose`` adds each graph's prologue (what builds its objects per
        call, as Python) and what the package's passes did; ``bytecode`` the prologue's
        instructions as well."""
        parts = [f"{self.graphs} graph(s), {len(self.graph_breaks)} graph break(s)"]
        parts.extend(f"  graph break: {reason}" for reason in self.graph_breaks)
        if not self.tables:
            parts.append("no graph with user objects was compiled")
        for table in self.tables:
            parts.append(table.describe(pass_notes=verbose))
            if verbose or bytecode:
                parts.extend(_prologue_lines(table, bytecode=bytecode))
        if self.tables:
            parts.append(LEGEND)
        return "\n".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain data (for a script, a log, a JSON file)."""
        return {
            "graphs": self.graphs,
            "graph_breaks": list(self.graph_breaks),
            "tables": [
                {
                    "graph": table.graph_name,
                    "entries": [
                        {
                            "index": entry.index,
                            "kind": entry.kind.value,
                            "phase": entry.phase.value,
                            "type": entry.example_type,
                            "origin": entry.origin,
                            "added_by": entry.added_by,
                            "loaded": table.loads(entry.index),
                        }
                        for entry in table.entries
                    ],
                    "pass_notes": list(table.pass_notes),
                    "prologue": table.prologue_listing,
                    "prologue_python": prologue_python(table),
                }
                for table in self.tables
            ],
        }


def prologue_python(table: UserObjectTable) -> str | None:
    """The prologue as the Python statement it runs (None for a graph without one, or one
    the reading cannot render: its bytecode then stands)."""
    if not table.prologue_listing:
        return None
    names = [
        f"[{entry.index}] {entry.origin}" + ("" if table.loads(entry.index) else " (not loaded)")
        for entry in table.entries
    ]
    return as_python(table.prologue_listing, names)


def _prologue_lines(table: UserObjectTable, *, bytecode: bool) -> list[str]:
    python = prologue_python(table)
    lines = []
    if python is not None:
        lines.append("prologue, before each call:")
        lines.extend("  " + line for line in python.splitlines())
    if bytecode or python is None:
        lines.append("prologue bytecode:")
        lines.extend("  " + line for line in table.prologue_listing.splitlines())
    return lines


def explain(
    fn: Callable[..., Any], *args: Any, backend: Any = "eager", **kwargs: Any
) -> ExplainReport:
    """Compile and run ``fn(*args, **kwargs)`` once with the package; report every graph.

    A fresh copy of ``fn`` is compiled, so it compiles even if ``fn`` was compiled before,
    and the rest of the process (other compiled functions, Dynamo's caches) is left alone.
    Frames ``fn`` reaches through a graph break that are already compiled keep their code.
    ``print(report)`` for the summary, ``report.text(verbose=True)`` for prologues and pass
    notes, ``report.to_dict()`` for data.
    """
    import torch

    from .compile.graph_compile import collecting_tables
    from .patch.install import installed

    with installed(), collecting_tables() as tables, _breaks.listening() as breaks:
        result = torch.compile(fresh_copy(fn), backend=backend)(*args, **kwargs)
    return ExplainReport(list(tables), result, tables.graphs, breaks)


class _BreakListener:
    """Dynamo keeps no list of the graph breaks of a compile (its counters miss most kinds),
    so its logging method is wrapped while any ``explain()`` runs: installed by the first,
    put back by the last (several threads may explain at once), each thread's breaks going
    to that thread's list."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.original: Any = None
        self.local = threading.local()

    @contextlib.contextmanager
    def listening(self) -> Iterator[list[str]]:
        from torch._dynamo.symbolic_convert import InstructionTranslatorBase as Translator

        found: list[str] = []
        outer = getattr(self.local, "found", None)
        self.local.found = found
        with self.lock:
            if self.users == 0:
                self.original = Translator.log_graph_break
                Translator.log_graph_break = self._wrapped(self.original)  # type: ignore[method-assign]
            self.users += 1
        try:
            yield found
        finally:
            self.local.found = outer
            with self.lock:
                self.users -= 1
                if self.users == 0:
                    Translator.log_graph_break = self.original  # type: ignore[method-assign]
                    self.original = None

    def _wrapped(self, original: Any) -> Any:
        local = self.local

        def log_graph_break(translator: Any, code_options: Any, reason: str, exc: Any) -> None:
            found = getattr(local, "found", None)
            if found is not None and not getattr(exc, "logged", False):
                text = " ".join(str(reason).split())
                code = translator.f_code.co_name
                found.append(f"{code}, line {translator.lineno}: {text}")
            original(translator, code_options, reason, exc)

        return log_graph_break


_breaks = _BreakListener()


def fresh_copy(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with a code object of its own: Dynamo caches compiled code per code object.

    A plain function is copied; any other callable (a module, a bound method) is called
    from a new forwarding function, which Dynamo traces into.
    """
    if not isinstance(fn, types.FunctionType):
        target = fn

        def forward(*args: Any, **kwargs: Any) -> Any:
            return target(*args, **kwargs)

        fn = forward
    copy = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy
