"""A fake accelerator for CPU-only machines: streams and events that say they are on one.

The package treats accelerator objects differently from CPU ones (the ambient current
stream is loaded per call; pass-made events are made for the streams' device), so those
paths need an accelerator to be tested. ``fake_accelerator()`` makes torch report one of
device type ``cuda`` whose streams and events are simulated: they record and wait as
logged no-ops (``SimStream`` / ``SimEvent``) while their ``device`` says ``cuda:0``.
Tensors stay on the CPU, which is exactly the mixed case a real GPU machine allows:
CPU tensors computed inside accelerator streams.

With ``gpu_semantics=True`` the package also takes every CPU tensor to live on the fake
accelerator for its decisions (``fx.meta.host_tensors_as``): the passes place the syncs a
GPU graph would get, the checker judges the graphs as GPU graphs, and the run-time race
detector (``testing.races``) sees what a GPU would race on. Without it a CPU tensor used
on two of these streams is host-ordered: nothing needs a sync, so nothing can be missing.
Compile inside the context: a graph keeps the decisions of the compile that made it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from ..simulator import SimEvent, SimStream

DEVICE = torch.device("cuda", 0)
# Where the objects really are, parsed once: each call makes its events anew.
_HOST = torch.device("cpu")


class FakeAcceleratorStream(SimStream):
    """A simulated stream whose device is the fake accelerator's. Each is its own stream:
    equal only to itself, as two CUDA streams are equal only where they are one (CPU
    streams all compare equal), so code that compares streams runs here as on a GPU."""

    def __new__(cls, *args: Any, **kwargs: Any) -> FakeAcceleratorStream:
        return super().__new__(cls, _HOST)  # type: ignore[call-arg, no-any-return]

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return DEVICE


class FakeAcceleratorEvent(SimEvent):
    """A simulated event whose device is the fake accelerator's."""

    def __new__(cls, *args: Any, **kwargs: Any) -> FakeAcceleratorEvent:
        return super().__new__(cls, _HOST)  # type: ignore[call-arg, no-any-return]

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return DEVICE


@contextlib.contextmanager
def fake_accelerator(*, gpu_semantics: bool = False) -> Iterator[FakeAcceleratorStream]:
    """Pretend a ``cuda`` accelerator is present; yields its (one) current stream. With
    ``gpu_semantics``, CPU tensors count as the accelerator's (see the module docstring)."""
    import torch._dynamo.guards
    import torch._dynamo.utils

    from ..compile import factories
    from ..fx.meta import host_tensors_as

    ambient = FakeAcceleratorStream()

    def current_stream(device: object = None) -> FakeAcceleratorStream:
        return ambient

    def fake_or(cpu_class: Any, fake_class: Any) -> Any:
        def pick(device: torch.device) -> Any:
            return fake_class if device.type == DEVICE.type else cpu_class(device)

        return pick

    patches = [
        (torch.accelerator, "is_available", lambda: True),
        (torch.accelerator, "current_accelerator", lambda check_available=False: DEVICE),
        (torch.accelerator, "device_count", lambda: 1),
        (torch.accelerator, "current_stream", current_stream),
        # Guards and the prologue read the current stream through Dynamo's own helper (a C
        # function on newer torch that checks the real accelerator).
        (torch._dynamo.utils, "get_current_stream", current_stream),
        (torch._dynamo.guards, "get_current_stream", current_stream),
        (factories, "stream_class", fake_or(factories.stream_class, FakeAcceleratorStream)),
        (factories, "event_class", fake_or(factories.event_class, FakeAcceleratorEvent)),
    ]
    saved = [(owner, name, vars(owner)[name]) for owner, name, _ in patches]
    try:
        for owner, name, value in patches:
            setattr(owner, name, value)
        _guard_closure_stream(current_stream)
        with host_tensors_as(DEVICE) if gpu_semantics else contextlib.nullcontext():
            yield ambient
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
        _guard_closure_stream(torch._dynamo.guards.get_current_stream)


def _guard_closure_stream(current_stream: Any) -> None:
    """Dynamo's guards call the current-stream helper through a dict it fills once per
    process (``guards._CLOSURE_VARS``, torch <= 2.14): point it at this context's stream,
    and back, or a second context's guards would compare against the first one's."""
    import torch._dynamo.guards

    closure = getattr(torch._dynamo.guards, "_CLOSURE_VARS", None)
    if isinstance(closure, dict) and "___get_current_stream" in closure:
        closure["___get_current_stream"] = current_stream
