"""``stream.record_event(event=e)``, ``wait_event(event=e)``, ``wait_stream(stream=s)``
trace as their positional spelling, where the stream's class takes the keyword.

Dynamo's handlers for these stream methods read only the positional argument: with the
keyword, ``record_event`` recorded a new event of its own and left ``e`` unrecorded, so a
later wait on ``e`` waited on nothing (a race on a GPU, silently), and the two waits failed
while tracing with an ``IndexError``. Which keywords eager accepts depends on the class:
``torch.cuda.Stream`` and other Python subclasses take them, ``torch.Stream``'s own methods
take one for ``record_event`` and none for the waits. So a call is rewritten to the
positional form only when the receiver's method takes the parameter by name; any other call
with keywords breaks the graph and runs in Python, as in eager (its ``TypeError`` included).
torch 2.14 checks the arguments of a ``torch.Stream`` or a Python subclass of it (not a CUDA
or XPU stream) against ``torch.Stream``'s own methods before the handler runs, and breaks
the graph itself at a keyword wait.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NoReturn

import torch

from ..originals import carries

# The parameter each stream method takes, by name (``torch.Stream``'s own signatures).
PARAMETER = {"record_event": "event", "wait_event": "event", "wait_stream": "stream"}
GRAPH_BREAK_TYPE = "torch_userstreams: stream method called with keyword arguments"
_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
# The methods of ``torch.Stream`` itself (C, no signature) that take their argument by name.
_TORCH_STREAM_KEYWORDS = frozenset({"record_event"})

TpMethod = Callable[[Any, Any, Any, Any], Any]


def positional(variable: Any, name: str, args: Any, kwargs: Any) -> tuple[Any, Any]:
    """``(args, kwargs)`` of a call of ``variable.name``, its parameter passed positionally."""
    if name == "record_event" and not args and not kwargs:
        _refuse_a_new_cpu_event(variable.value)
    param = PARAMETER.get(name)
    if param is None or not kwargs:
        return args, kwargs
    if set(kwargs) == {param} and not args and takes_by_name(variable.value, name, param):
        return [kwargs[param]], {}
    _graph_break(variable, name, param)


def _refuse_a_new_cpu_event(stream: Any) -> None:
    """``stream.record_event()`` on a native CPU stream: Dynamo records a real event while
    tracing it, which torch refuses on CPU with only "cpu backend doesn't support events"."""
    from ..errors import UserObjectError

    if type(stream) is torch.Stream and stream.device.type == "cpu":
        raise UserObjectError(
            "torch_userstreams: stream.record_event() with no event cannot be traced on a "
            "native CPU torch.Stream: Dynamo records a real event while tracing, and torch "
            'refuses CPU events ("cpu backend doesn\'t support events"). Write '
            "event = torch.Event(device='cpu'); event.record(stream) instead (with "
            "backend='userstreams_aot_eager', which issues every sync, pass "
            "torch_userstreams.simulator.SimStream(device='cpu') as the stream)."
        )


def takes_by_name(value: Any, name: str, param: str) -> bool:
    """Whether ``type(value).name`` takes ``param`` as a keyword. ``torch.Stream``'s own
    methods have no signature to read: of them only ``record_event`` parses its argument by
    name. Another builtin without a signature is left to eager to decide."""
    method = getattr(type(value), name)
    if method is getattr(torch.Stream, name):
        return name in _TORCH_STREAM_KEYWORDS
    try:
        signature = inspect.signature(method)
    except (TypeError, ValueError):
        return False
    parameter = signature.parameters.get(param)
    return parameter is not None and parameter.kind in _BY_NAME


def _graph_break(variable: Any, name: str, param: str) -> NoReturn:
    from torch._dynamo.exc import unimplemented

    call = f"{type(variable.value).__qualname__}.{name}()"
    unimplemented(
        gb_type=GRAPH_BREAK_TYPE,
        context=call,
        explanation=(
            f"{call} is called with keyword arguments its class does not take (it takes "
            f"{param!r}), or takes in a way torch_userstreams cannot read. It runs outside "
            "the graph, as in eager."
        ),
        hints=[f"Call it as {name}({param}), positionally."],
    )


def wrap_tp_method(native: TpMethod) -> TpMethod:
    """The replacement for a ``StreamVariable`` ``tp_methods`` handler (torch 2.14+)."""

    @carries(native)
    def handler(self: Any, tx: Any, args: Any, kwargs: Any) -> Any:
        args, kwargs = positional(self, native.__name__, args, kwargs)
        return native(self, tx, args, kwargs)

    return handler
