"""Issue a graph's sync ops directly against the call's objects.

The executors run the ``streams::*`` (and the package's own) sync nodes of a graph by
calling the stream and event methods themselves: the objects come from ``lookup`` (the call's
binding, or its backward's), so a graph compiled while installed keeps using its own objects
after ``uninstall()``, and no dispatcher round trip is paid per sync.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import UnsupportedPathError, UserObjectError, UserStreamsError
from ..fx.ops import SYNC_ROLES, op_name
from ..simulator import SimEvent, SimStream
from .backward import backward_binding
from .binding import graph_of
from .lookup import lookup
from .state import state


def _record_event(event: int, stream: int) -> None:
    lookup(event).record(lookup(stream))


def _wait_event(event: int, stream: int) -> None:
    lookup(event).wait(lookup(stream))


def _wait_stream(waiting: int, waited_on: int) -> None:
    lookup(waiting).wait_stream(lookup(waited_on))


def _sync_dealloc(event: int, stream: int, tensor: torch.Tensor) -> None:
    # Holding ``tensor`` until here is the point: its memory is not released before the
    # allocating stream waits for the last use elsewhere.
    lookup(event).wait(lookup(stream))


def _synchronize_event(event: int) -> None:
    lookup(event).synchronize()


def _synchronize_stream(stream: int) -> None:
    lookup(stream).synchronize()


def _synchronize_device(device_type: str, device_index: int | None = None) -> None:
    device = (
        torch.device(device_type)
        if device_index is None
        else torch.device(device_type, device_index)
    )
    torch.accelerator.synchronize(device)


def _record_stream(tensor: torch.Tensor, stream: int) -> None:
    tensor.record_stream(lookup(stream))


ISSUERS: dict[str, Callable[..., None]] = {
    "record_event": _record_event,
    "wait_event": _wait_event,
    "wait_stream": _wait_stream,
    "sync_dealloc": _sync_dealloc,
    "synchronize_event": _synchronize_event,
    "synchronize_stream": _synchronize_stream,
    "synchronize_device": _synchronize_device,
    "record_stream": _record_stream,
}


# What each issuer's positional arguments must name: an event, a stream, or anything.
_KIND_OF_ROLE: dict[str, type] = {
    "event": torch.Event,
    "stream": torch.Stream,
    "waited": torch.Stream,
}
_KINDS: dict[Callable[..., None], tuple[type | None, ...]] = {
    ISSUERS[name]: tuple(_KIND_OF_ROLE.get(role) for role in roles)
    for name, roles in SYNC_ROLES.items()
}


def misuse(call: Callable[..., Any], args: tuple[Any, ...], stream: int | None) -> str | None:
    """Why a step failed, if it named a user object of the wrong kind: a stream annotation
    on an event, or a sync given a stream where it takes an event (or the reverse)."""
    if stream is not None and not isinstance(lookup(stream), torch.Stream):
        return f"a node runs on user object {stream} ({_kind(stream)}), which is not a stream"
    for position, (arg, kind) in enumerate(zip(args, _KINDS.get(call, ()), strict=False)):
        if kind is not None and type(arg) is int and not isinstance(lookup(arg), kind):
            name = next(name for name, issue in ISSUERS.items() if issue is call)
            wanted = "an event" if kind is torch.Event else "a stream"
            return (
                f"the sync {name} takes {wanted} as argument {position}, but user object "
                f"{arg} is {_kind(arg)}"
            )
    return None


def diagnose(
    call: Callable[..., Any], args: tuple[Any, ...], stream: int | None, exc: Exception
) -> UserObjectError | None:
    """What the package can say about a step that raised ``exc`` and torch could not: a
    user object of the wrong kind, or a native CPU object. None: re-raise ``exc`` (the
    package's own errors say it already). Only asked after a step raised, so the per-call
    path pays nothing for it."""
    if isinstance(exc, UserStreamsError):
        return None
    if isinstance(exc, RuntimeError):
        return native_cpu_object(call, args)
    problem = misuse(call, args, stream)
    return None if problem is None else misuse_error(problem)


def native_cpu_object(call: Callable[..., Any], args: tuple[Any, ...]) -> UserObjectError | None:
    """The error for a sync on a native CPU ``torch.Event`` or ``torch.Stream`` (torch
    refuses with only "cpu backend doesn't support events"), or None."""
    for arg, kind in zip(args, _KINDS.get(call, ()), strict=False):
        if kind is None or type(arg) is not int:
            continue
        obj = lookup(arg)
        if isinstance(obj, (SimEvent, SimStream)) or getattr(obj, "device", None) != _CPU:
            continue
        stand_in = "SimEvent" if kind is torch.Event else "SimStream"
        return UserObjectError(
            f"torch_userstreams: in graph {_graph_name()}, user object {arg} "
            f"({_origin(arg)}) is a native CPU torch.{kind.__name__}, on which torch refuses "
            'syncs ("cpu backend doesn\'t support events"), eagerly or compiled. On CPU, '
            f"pass torch_userstreams.simulator.{stand_in}(device='cpu') in its place, or "
            "create it inside the compiled function, where the prologue builds a simulated "
            "one; next to accelerator streams, pass an object of their device."
        )
    return None


_CPU = torch.device("cpu")


def _kind(index: int) -> str:
    return f"a {type(lookup(index)).__name__}"


def misuse_error(problem: str) -> UserObjectError:
    """``problem`` (from ``misuse``) as the error, naming the graph whose call raised it."""
    return UserObjectError(
        f"torch_userstreams: in graph {_graph_name()}, {problem}. A backend that writes stream "
        "annotations or sync ops must give stream indices from new_stream() or "
        "current_stream() and event indices from new_event()."
    )


def _graph_name() -> str:
    """The graph whose call (or backward) runs on this thread."""
    binding = state.calls.current or backward_binding()
    return "?" if binding is None else graph_of(binding).table.graph_name


def _origin(index: int) -> str:
    """Where the graph's object ``index`` comes from (``L['ev']``), as the table says."""
    binding = state.calls.current or backward_binding()
    return "?" if binding is None else graph_of(binding).table.entries[index].origin


def issuer(target: Any) -> Callable[..., None]:
    """The function that performs the sync op ``target`` with the same arguments."""
    name = op_name(target)
    try:
        return ISSUERS[name]
    except KeyError:
        raise UnsupportedPathError(
            f"torch_userstreams: the sync op {target} (streams::{name}) has no executor; "
            "the package's graphs do not contain it. Report the program that made it."
        ) from None
