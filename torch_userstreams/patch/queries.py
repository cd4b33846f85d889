"""``Stream.query()`` / ``Event.query()`` in a compiled function run on every call.

``query()`` asks whether the work before it has finished, at the moment it runs. Dynamo
traces it into a constant: the answer the example object gave while tracing. A branch on it
(``if prefetched.query(): use it, else fall back``) was decided once, at compile time, and
every later call took that branch whatever the device's state: a silent wrong result.

The replacement breaks the graph at ``query()`` instead, so it runs in Python on the call's
own object, and the code after it resumes in a compiled graph. Under ``fullgraph=True``
that is an error naming ``query()``. Every other method is traced as natively.

Inside a ``with stream:`` block Dynamo cannot resume after a graph break (the block is an
annotation it cannot re-enter), so it runs the whole function eagerly: results stay right,
nothing is compiled. The same holds after the block while a stream the function created is
live. The graph break's explanation says which and names the fix: query before or after the
block; create the stream outside the function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .keyword_args import positional

CallMethod = Callable[..., Any]
GRAPH_BREAK_TYPE = "torch_userstreams: query() of a stream or event"


def _in_stream_block(tx: Any) -> bool:
    """Whether the traced code is inside a ``with stream:`` block."""
    from torch._dynamo.variables.streams import StreamContextVariable

    blocks = getattr(tx, "block_stack", ())
    return any(isinstance(b.with_context, StreamContextVariable) for b in blocks)


def _holds_created_stream(tx: Any) -> bool:
    """Whether a stream the compiled function created is live in a traced frame: Dynamo
    cannot carry one across a graph break, inside a ``with stream:`` block or not."""
    from torch._dynamo.variables.streams import StreamVariable

    while tx is not None:
        values = [*getattr(tx, "symbolic_locals", {}).values(), *getattr(tx, "stack", ())]
        if any(isinstance(v, StreamVariable) and v.source is None for v in values):
            return True
        tx = getattr(tx, "parent", None)
    return False


def _graph_break(variable: Any, tx: Any) -> None:
    from torch._dynamo.exc import unimplemented

    call = f"{type(variable.value).__qualname__}.query()"
    explanation = (
        f"{call} reports whether earlier work has finished when it runs; traced, it "
        "would return the answer it gave while compiling on every call. "
        "torch_userstreams runs it outside the graph instead."
    )
    hints = [
        "Keep the graph break, or move query() out of the compiled function "
        "(with fullgraph=True it must be moved out).",
    ]
    if _in_stream_block(tx):
        explanation += (
            " It is inside a `with stream:` block, where Dynamo cannot resume after a "
            "graph break: the whole function runs eagerly, uncompiled."
        )
        hints.insert(0, "Call query() before or after the `with stream:` block.")
    elif _holds_created_stream(tx):
        explanation += (
            " The function holds a stream it created, which Dynamo cannot carry across a "
            "graph break: the rest of the function runs eagerly, uncompiled."
        )
        hints.insert(0, "Create the stream outside the compiled function and pass it in.")
    unimplemented(gb_type=GRAPH_BREAK_TYPE, context=call, explanation=explanation, hints=hints)


def wrap_call_method(native: CallMethod) -> CallMethod:
    """The replacement for ``StreamVariable.call_method`` / ``EventVariable.call_method``
    (torch up to 2.13). It also passes stream methods' keyword arguments positionally
    (``keyword_args``), which 2.14+ gets from its own ``tp_methods`` handlers."""

    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        if name == "query":
            _graph_break(self, tx)
        args, kwargs = positional(self, name, args, kwargs)
        return native(self, tx, name, args, kwargs)

    call_method.__wrapped__ = native  # type: ignore[attr-defined]
    return call_method


def wrap_query(native: CallMethod) -> CallMethod:
    """The replacement for the ``query`` handler of ``StreamVariable`` / ``EventVariable``
    (torch 2.14+, where Dynamo dispatches methods through ``tp_methods``)."""

    def query(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        _graph_break(self, tx)

    query.__wrapped__ = native  # type: ignore[attr-defined]
    return query
