"""The compile-time API for backend authors: request objects for the graph being compiled.

Each function adds an entry to the table of the graph whose backend is running and returns
its index. Put the index into the graph (``torch_userstreams.lookup(index)`` as an FX node
target, or the ``streams::*`` ops): at run time it resolves to *that call's* object, built
by the prologue with exactly the device and flags asked for here.
"""

from __future__ import annotations

from typing import Any

import torch

from . import emitters, factories, provenance
from .registration import compiling_table, current_table
from .runtime import lookup
from .table import EntryKind, Phase, UserObjectTable

__all__ = ["current_stream", "lookup", "new_event", "new_stream"]

DeviceLike = factories.DeviceLike


def _phase(phase: Phase | str | None, inferred: Phase) -> Phase:
    return inferred if phase is None else Phase(phase)


def _add_requested(
    table: UserObjectTable,
    cls: type,
    kwargs: dict[str, Any],
    origin: str,
    phase: Phase | str | None,
) -> int:
    factory = factories.constructor(cls, (), kwargs)
    example = factory()
    added_by, inferred = provenance.caller()
    return table.add(
        EntryKind.REQUESTED,
        origin,
        emitters.from_factory(factory),
        example,
        added_by=added_by,
        phase=_phase(phase, inferred),
    )


def _kwargs(**given: Any) -> dict[str, Any]:
    return {key: value for key, value in given.items() if value is not None}


def _call_text(name: str, kwargs: dict[str, Any]) -> str:
    def shown(value: Any) -> str:
        return repr(str(value) if isinstance(value, torch.device) else value)

    return f"{name}({', '.join(f'{k}={shown(v)}' for k, v in kwargs.items())})"


def new_stream(
    device: DeviceLike = None, priority: int = 0, *, phase: Phase | str | None = None
) -> int:
    """Request a stream, created fresh on each call of the graph being compiled."""
    table = compiling_table("new_stream")
    resolved = factories.resolve_device(device)
    kwargs = _kwargs(device=resolved, priority=priority or None)
    text = _call_text("torch.Stream", _kwargs(device=device, priority=priority or None))
    return _add_requested(table, factories.stream_class(resolved), kwargs, text, phase)


def new_event(
    device: DeviceLike = None,
    *,
    enable_timing: bool = False,
    blocking: bool = False,
    interprocess: bool = False,
    phase: Phase | str | None = None,
) -> int:
    """Request an event, created fresh on each call of the graph being compiled."""
    table = compiling_table("new_event")
    resolved = factories.resolve_device(device)
    flags = _kwargs(
        enable_timing=enable_timing or None,
        blocking=blocking or None,
        interprocess=interprocess or None,
    )
    text = _call_text("torch.Event", _kwargs(device=device, **flags))
    kwargs = {"device": resolved, **flags}
    return _add_requested(table, factories.event_class(resolved), kwargs, text, phase)


def current_stream_entry(table: UserObjectTable, device: torch.device, added_by: str) -> int:
    """The entry for ``device``'s ambient stream, added once per graph and always loaded."""
    origin = f"current stream of {device}"
    entry = table.find(EntryKind.CURRENT_STREAM, origin)
    if entry is not None:
        entry.requested = True
        return entry.index
    if device.type == "cpu":
        # CPU has no stream switching: its current stream is the default CPU stream.
        factory = factories.constructor(factories.stream_class(device), (), {"device": device})
        emit, example = emitters.from_factory(factory), factory()
    else:
        emit, example = emitters.current_stream(device), torch.accelerator.current_stream(device)
    index = table.add(EntryKind.CURRENT_STREAM, origin, emit, example, added_by=added_by)
    table.entries[index].requested = True
    return index


def current_stream(device: DeviceLike = None) -> int:
    """Request the ambient current stream of ``device`` as it is at each call."""
    table = compiling_table("current_stream")
    added_by, _ = provenance.caller()
    return current_stream_entry(table, factories.resolve_device(device), added_by)


def native_get_current_stream(device: torch.device) -> int:
    """Replacement for Dynamo's ``get_current_stream``: no new entry per call of it."""
    added_by, _ = provenance.caller()
    return current_stream_entry(current_table(), factories.resolve_device(device), added_by)
