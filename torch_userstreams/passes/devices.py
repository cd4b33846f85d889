"""Which stream a node runs on, and the device of an event that orders two streams."""

from __future__ import annotations

import torch
import torch.fx

from .. import api
from ..compile.graph_compile import GraphCompile
from ..compile.table import Phase, Reader
from ..errors import UnsupportedPathError
from ..fx.meta import device_of, stream_of


def stream_index(node: torch.fx.Node, compile_: GraphCompile, added_by: str) -> int:
    """The stream ``node`` runs on as a table index; its device's current stream if unset."""
    index = stream_of(node)
    if index is not None:
        return index
    return compile_.current_stream(device_of(node), added_by=added_by, read_by=Reader.ADDED_NODES)


def stream_device(node: torch.fx.Node, compile_: GraphCompile) -> torch.device:
    """The device of the stream ``node`` runs on: its annotated stream's, else its own."""
    index = stream_of(node)
    return device_of(node) if index is None else compile_.table.device(index)


def host_ordered(value: torch.device, first: torch.device, second: torch.device) -> bool:
    """Whether a tensor on ``value`` used on streams of ``first`` and ``second`` gets no
    event: no event can order a CPU stream with an accelerator stream, and work on a CPU
    tensor runs on the host, in program order. The exception is a ``non_blocking`` copy
    from pinned memory to the accelerator, which reads the CPU buffer later on the
    accelerator's stream; nothing here orders the buffer's reuse after it."""
    return value.type == "cpu" and first.type != second.type


def event_device(
    value: torch.fx.Node, recorder: torch.fx.Node, waiter: torch.fx.Node, compile_: GraphCompile
) -> torch.device | None:
    """The device of an event that makes ``waiter``'s stream wait for ``recorder``'s work on
    ``value``: the recording stream's. None when no sync is needed: work on a CPU tensor
    runs on the host in program order, whatever stream context it was issued in.

    Raises when an accelerator's work would have to wait on a CPU stream (or the reverse):
    no event can express that.
    """
    recorded_on, waited_on = stream_device(recorder, compile_), stream_device(waiter, compile_)
    if recorded_on.type == waited_on.type:
        return recorded_on
    device = device_of(value)
    if host_ordered(device, recorded_on, waited_on):
        return None
    raise UnsupportedPathError(
        f"torch_userstreams: graph {compile_.table.graph_name} uses the {device} tensor "
        f"{value.name} on a {recorded_on} stream ({recorder.name}) and on a {waited_on} stream "
        f"({waiter.name}); an event of one device cannot order the other's stream. Issue work "
        f"on {device} tensors inside {device.type} streams only (torch.Stream(device="
        f"{str(device)!r}))."
    )


def new_event(
    compile_: GraphCompile, device: torch.device, *, added_by: str, backward: bool
) -> int:
    """An event a pass inserts, made per call for ``device``; only the pass's sync nodes
    read it."""
    phase = Phase.BACKWARD if backward else Phase.FORWARD
    return api.request_event(
        compile_, device, {}, added_by=added_by, phase=phase, read_by=Reader.ADDED_NODES
    )
