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

from ..errors import UnsupportedPathError
from ..fx.ops import op_name
from .lookup import lookup


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
