"""``Stream.query()`` / ``Event.query()`` in a compiled function run on every call.

``query()`` asks whether the work before it has finished, at the moment it runs. Dynamo
traces it into a constant: the answer the example object gave while tracing. A branch on it
(``if prefetched.query(): use it, else fall back``) was decided once, at compile time, and
every later call took that branch whatever the device's state: a silent wrong result.

The replacement breaks the graph at ``query()`` instead, so it runs in Python on the call's
own object, and the code after it resumes in a compiled graph. Under ``fullgraph=True``
that is an error naming ``query()``. Every other method is traced as natively.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CallMethod = Callable[..., Any]
GRAPH_BREAK_TYPE = "torch_userstreams: query() of a stream or event"


def _graph_break(variable: Any) -> None:
    from torch._dynamo.exc import unimplemented

    call = f"{type(variable.value).__qualname__}.query()"
    unimplemented(
        gb_type=GRAPH_BREAK_TYPE,
        context=call,
        explanation=(
            f"{call} reports whether earlier work has finished when it runs; traced, it "
            "would return the answer it gave while compiling on every call. "
            "torch_userstreams runs it outside the graph instead."
        ),
        hints=[
            "Keep the graph break, or move query() out of the compiled function "
            "(with fullgraph=True it must be moved out).",
        ],
    )


def wrap_call_method(native: CallMethod) -> CallMethod:
    """The replacement for ``StreamVariable.call_method`` / ``EventVariable.call_method``
    (torch up to 2.13)."""

    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        if name == "query":
            _graph_break(self)
        return native(self, tx, name, args, kwargs)

    call_method.__wrapped__ = native  # type: ignore[attr-defined]
    return call_method


def wrap_query(native: CallMethod) -> CallMethod:
    """The replacement for the ``query`` handler of ``StreamVariable`` / ``EventVariable``
    (torch 2.14+, where Dynamo dispatches methods through ``tp_methods``)."""

    def query(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        _graph_break(self)

    query.__wrapped__ = native  # type: ignore[attr-defined]
    return query
