"""``event.wait()`` / ``event.record()`` with no stream, on a machine with no accelerator.

Dynamo resolves the missing stream to the top of its stack of entered streams. Native seeds
that stack with the accelerator's current stream, so on a CPU-only machine it is empty
outside a ``with stream:`` block, and tracing the most common spelling of a fork or join
fails natively with ``IndexError: deque index out of range``. There, the package answers with the
graph's CPU current-stream entry: CPU runs every op in program order, so the ambient CPU
stream is the one eager means, and the executors and the race checker read it like any
current stream.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..compile import graph_compile
from ..originals import carries
from .replacements import DYNAMO

CPU = torch.device("cpu")


class AmbientCpuStream:
    """What native's callers read of the stream they get: its value and table index."""

    def __init__(self, index: int, value: torch.Stream) -> None:
        self.user_object_index = index
        self.value = value


def wrap_get_stream_arg(native: Callable[..., Any]) -> Callable[..., Any]:
    """The replacement for ``EventVariable._get_stream_arg``: native's unless the call names
    no stream and no stream is entered. torch 2.11 returns the stream variable, later ones
    a ``(variable, index)`` pair: the fallback answers in native's shape."""
    pair = "tuple" in str(inspect.signature(native).return_annotation)

    @carries(native)
    def _get_stream_arg(tx: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        named = bool(args) or kwargs.get("stream") is not None
        if named or tx.symbolic_stream_state.in_stream_context():
            return native(tx, args, kwargs)
        stream = ambient_cpu_stream()
        return (stream, stream.user_object_index) if pair else stream

    return _get_stream_arg


def ambient_cpu_stream() -> AmbientCpuStream:
    """The traced graph's entry for the CPU current stream, added once per graph."""
    compile_ = graph_compile.current("an event's wait() or record() with no stream")
    index = compile_.current_stream_entry(CPU, added_by=DYNAMO)
    return AmbientCpuStream(index, compile_.table.example(index))
