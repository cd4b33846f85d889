"""How the prologue builds a graph's own objects on each call.

Each graph-created or requested entry gets a zero-argument factory made once at compile
time (a ``functools.partial`` of the constructor with the exact arguments recorded then),
so the per-call cost is one call. Native Dynamo rebuilds backend-requested objects with no
arguments at all, which loses their device and flags; we keep them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from ..simulator import SimEvent, SimStream

DeviceLike = torch.device | str | int | None


def resolve_device(device: DeviceLike) -> torch.device:
    """The device a stream or event asked for with ``device`` is made on (as torch does)."""
    if device is None or isinstance(device, int):
        accelerator = torch.accelerator.current_accelerator()
        kind = accelerator.type if accelerator is not None else "cpu"
        return torch.device(kind) if device is None else torch.device(kind, device)
    return torch.device(device)


def stream_class(device: torch.device) -> type[torch.Stream]:
    """CPU streams are simulated (CPU has no real stream syncs); others are real."""
    return SimStream if device.type == "cpu" else torch.Stream


def event_class(device: torch.device) -> type[torch.Event]:
    """CPU events are simulated (native CPU events cannot record); others are real."""
    return SimEvent if device.type == "cpu" else torch.Event


def constructor(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    """A zero-argument call of ``cls(*args, **kwargs)``, made cheap for the per-call path.

    The device goes positionally and already parsed: ``torch.Stream(torch.device("cpu"))``
    builds the same object as ``torch.Stream(device="cpu")`` in half the time, because the
    string is not parsed again on every call.
    """
    kwargs = dict(kwargs)
    if not args and "device" in kwargs:
        args = (kwargs.pop("device"),)
    if args and isinstance(args[0], str):
        args = (torch.device(args[0]), *args[1:])
    return functools.partial(cls, *args, **kwargs)


def factory_for(example: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[[], Any]:
    """A zero-argument constructor that rebuilds an object like ``example`` each call."""
    if isinstance(example, torch.Stream):
        cls: type = stream_class(example.device)
    elif isinstance(example, torch.Event):
        cls = event_class(example.device)
    else:
        cls = type(example)
    return constructor(cls, args, kwargs)
