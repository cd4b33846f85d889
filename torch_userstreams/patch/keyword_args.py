"""``stream.record_event(event=e)``, ``wait_event(event=e)``, ``wait_stream(stream=s)``
trace as their positional spelling.

Dynamo's handlers for these ``torch.Stream`` methods read only the positional argument:
with the keyword, ``record_event`` recorded a new event of its own and left ``e``
unrecorded, so a later ``e.wait()`` waited on nothing (a race on a GPU, silently), and the
two waits failed while tracing with an ``IndexError``. Eager accepts the keyword, so the
call is rewritten to the positional form before the native handler sees it. Arguments
eager would refuse (an unknown keyword, the argument twice) break the graph instead, so the
call runs in Python and raises eager's own ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

# The parameter each stream method takes, by name (``torch.Stream``'s own signatures).
PARAMETER = {"record_event": "event", "wait_event": "event", "wait_stream": "stream"}
GRAPH_BREAK_TYPE = "torch_userstreams: stream method called with unexpected arguments"

TpMethod = Callable[[Any, Any, Any, Any], Any]


def positional(variable: Any, name: str, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """``(args, kwargs)`` of a call of ``variable.name``, its parameter passed positionally."""
    param = PARAMETER.get(name)
    if param is None or not kwargs:
        return args, kwargs
    if set(kwargs) == {param} and not args:
        return [kwargs[param]], {}
    _graph_break(variable, name, param)


def _graph_break(variable: Any, name: str, param: str) -> NoReturn:
    from torch._dynamo.exc import unimplemented

    call = f"{type(variable.value).__qualname__}.{name}()"
    unimplemented(
        gb_type=GRAPH_BREAK_TYPE,
        context=call,
        explanation=(
            f"{call} takes one argument, {param!r}; this call passes other arguments, which "
            "eager refuses. torch_userstreams runs it outside the graph, where it raises "
            "eager's error."
        ),
        hints=[f"Call it as {name}({param}) or {name}({param}={param})."],
    )


def wrap_tp_method(native: TpMethod) -> TpMethod:
    """The replacement for a ``StreamVariable`` ``tp_methods`` handler (torch 2.14+)."""

    def handler(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        args, kwargs = positional(self, native.__name__, args, kwargs)
        return native(self, tx, args, kwargs)

    handler.__wrapped__ = native  # type: ignore[attr-defined]
    return handler
