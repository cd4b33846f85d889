"""The compile-time API for backend authors: request objects for the graph being compiled.

Each function adds an entry to the table of the graph whose backend is running and returns
its index. Put the index into the graph (``torch_userstreams.lookup(index)`` as an FX node
target, or the ``streams::*`` ops): at run time it resolves to *that call's* object, built
by the prologue with exactly the device and flags asked for here. ``added_by`` names the
requester in ``explain()`` (default: "backend"); ``phase`` says which graph reads it.
"""

from __future__ import annotations

from typing import Any

from .compile import factories, graph_compile
from .compile.graph_compile import GraphCompile
from .compile.table import Phase, Reader
from .run.lookup import lookup

__all__ = ["current_stream", "lookup", "new_event", "new_stream"]

DeviceLike = factories.DeviceLike
BACKEND = "backend"


def _call_text(name: str, given: dict[str, Any]) -> str:
    shown = {k: str(v) if hasattr(v, "type") else v for k, v in given.items() if v is not None}
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


def request_stream(
    compile_: GraphCompile, device: DeviceLike, priority: int, *, added_by: str, phase: Phase
) -> int:
    """A stream for ``compile_``'s graph, made fresh on each call."""
    resolved = factories.resolve_device(device)
    text = _call_text("torch.Stream", {"device": device, "priority": priority or None})
    return compile_.new_stream(
        resolved, priority=priority, added_by=added_by, phase=phase, text=text
    )


def request_event(
    compile_: GraphCompile,
    device: DeviceLike,
    flags: dict[str, bool],
    *,
    added_by: str,
    phase: Phase,
    read_by: Reader = Reader.CODE,
) -> int:
    """An event for ``compile_``'s graph, made fresh on each call (``read_by``: see
    ``GraphCompile.new_event``)."""
    resolved = factories.resolve_device(device)
    text = _call_text("torch.Event", {"device": device, **{k: v or None for k, v in flags.items()}})
    return compile_.new_event(
        resolved,
        flags=flags,
        added_by=added_by,
        phase=phase,
        text=text,
        read_by=read_by,
    )


def _phase(api: str, phase: Phase | str) -> Phase:
    """``phase`` as a ``Phase``; a value that is none names the valid ones."""
    try:
        return Phase(phase)
    except ValueError:
        valid = ", ".join(repr(p.value) for p in Phase)
        raise ValueError(
            f"torch_userstreams.{api}: phase={phase!r} is not a phase; use one of {valid} "
            "(or torch_userstreams.compile.table.Phase): the graph that reads the object."
        ) from None


def new_stream(
    device: DeviceLike = None,
    priority: int = 0,
    *,
    phase: Phase | str = Phase.FORWARD,
    added_by: str = BACKEND,
) -> int:
    """Request a stream, created fresh on each call of the graph being compiled."""
    compile_ = graph_compile.active("new_stream")
    phase = _phase("new_stream", phase)
    return request_stream(compile_, device, priority, added_by=added_by, phase=phase)


def new_event(
    device: DeviceLike = None,
    *,
    enable_timing: bool = False,
    blocking: bool = False,
    interprocess: bool = False,
    phase: Phase | str = Phase.FORWARD,
    added_by: str = BACKEND,
) -> int:
    """Request an event, created fresh on each call of the graph being compiled."""
    compile_ = graph_compile.active("new_event")
    flags = {"enable_timing": enable_timing, "blocking": blocking, "interprocess": interprocess}
    phase = _phase("new_event", phase)
    return request_event(compile_, device, flags, added_by=added_by, phase=phase)


def current_stream(device: DeviceLike = None, *, added_by: str = BACKEND) -> int:
    """Request the ambient current stream of ``device`` as it is at each call."""
    compile_ = graph_compile.active("current_stream")
    return compile_.current_stream(factories.resolve_device(device), added_by=added_by)
