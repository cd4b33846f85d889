"""``explain()``: what user objects each graph of a function has, and its prologue."""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .compile.table import UserObjectTable


@dataclass
class ExplainReport:
    """The tables of the graphs compiled while explaining, in compile order."""

    tables: list[UserObjectTable] = field(default_factory=list)
    result: Any = None

    def __str__(self) -> str:
        if not self.tables:
            return "no graph with user objects was compiled"
        parts = []
        for table in self.tables:
            parts.append(table.describe())
            parts.append("prologue:")
            parts.extend("  " + line for line in table.prologue_listing.splitlines())
        return "\n".join(parts)


def explain(
    fn: Callable[..., Any], *args: Any, backend: Any = "eager", **kwargs: Any
) -> ExplainReport:
    """Compile and run ``fn(*args, **kwargs)`` once with the package; report every graph.

    A fresh copy of ``fn`` is compiled, so it compiles even if ``fn`` was compiled before,
    and the rest of the process (other compiled functions, Dynamo's caches) is left alone.
    Frames ``fn`` reaches through a graph break that are already compiled keep their code.
    """
    import torch

    from .compile.graph_compile import collecting_tables
    from .patch.install import installed

    with installed(), collecting_tables() as tables:
        result = torch.compile(fresh_copy(fn), backend=backend)(*args, **kwargs)
    return ExplainReport(tables=list(tables), result=result)


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
