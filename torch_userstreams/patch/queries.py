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
nothing is compiled. The same holds after the block when the code after ``query()`` still
uses a stream the function created (or read from a container or an attribute). The graph
break's explanation says which and names the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..originals import carries
from .keyword_args import positional

CallMethod = Callable[..., Any]
GRAPH_BREAK_TYPE = "torch_userstreams: query() of a stream or event"


def _in_stream_block(tx: Any) -> bool:
    """Whether the traced code is inside a ``with stream:`` block."""
    from torch._dynamo.variables.streams import StreamContextVariable

    blocks = getattr(tx, "block_stack", ())
    return any(isinstance(b.with_context, StreamContextVariable) for b in blocks)


def _stream_blocks_resume(tx: Any) -> bool:
    """Whether the code after the graph break still uses a stream Dynamo would have to
    rebuild to resume there, which it cannot (a stream is a context manager to it): one on
    a frame's stack, or in a local read later, other than an argument of the compiled
    function itself that still holds what was passed in."""
    from torch._dynamo.bytecode_analysis import livevars_analysis
    from torch._dynamo.source import LocalSource
    from torch._dynamo.variables.streams import StreamVariable

    frame = tx
    while frame is not None:
        if any(isinstance(value, StreamVariable) for value in frame.stack):
            return True
        read_later = livevars_analysis(frame.instructions, frame.current_instruction)
        for name, value in frame.symbolic_locals.items():
            if name not in read_later or not isinstance(value, StreamVariable):
                continue
            passed_in = isinstance(value.source, LocalSource) and value.source.local_name == name
            if not (passed_in and frame.parent is None):
                return True
        frame = frame.parent
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
    elif _stream_blocks_resume(tx):
        explanation += (
            " The code after it still uses a stream the function created or took from "
            "elsewhere, which Dynamo cannot carry across a graph break: the rest of the "
            "function runs eagerly, uncompiled."
        )
        hints.insert(
            0,
            "Pass the stream in as an argument and use that argument directly, or call "
            "query() where no stream is used after it.",
        )
    unimplemented(gb_type=GRAPH_BREAK_TYPE, context=call, explanation=explanation, hints=hints)


def wrap_call_method(native: CallMethod) -> CallMethod:
    """The replacement for ``StreamVariable.call_method`` / ``EventVariable.call_method``
    (torch up to 2.13). It also passes stream methods' keyword arguments positionally
    (``keyword_args``), which 2.14+ gets from its own ``tp_methods`` handlers."""

    @carries(native)
    def call_method(self: Any, tx: Any, name: str, args: Any, kwargs: Any) -> Any:
        if name == "query":
            _graph_break(self, tx)
        args, kwargs = positional(self, name, args, kwargs)
        return native(self, tx, name, args, kwargs)

    return call_method


def wrap_query(native: CallMethod) -> CallMethod:
    """The replacement for the ``query`` handler of ``StreamVariable`` / ``EventVariable``
    (torch 2.14+, where Dynamo dispatches methods through ``tp_methods``)."""

    @carries(native)
    def query(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        _graph_break(self, tx)

    return query
