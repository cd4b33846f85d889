"""``explain()``: what user objects each graph of a function has, and its prologue."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .table import UserObjectTable


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
    """Compile and run ``fn(*args, **kwargs)`` once with the package; report every graph."""
    import torch

    from . import installed
    from .registration import collecting_tables

    torch._dynamo.reset()
    with installed(), collecting_tables() as tables:
        result = torch.compile(fn, backend=backend)(*args, **kwargs)
    return ExplainReport(tables=list(tables), result=result)
