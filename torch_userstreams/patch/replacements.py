"""What replaces each native Dynamo user-object function: routes to the graph's compile.

``patch.install`` writes each of these over the native function *and* over every by-value
alias of it, and restores the originals on ``uninstall()``. The ones made by a ``wrap_``
factory are given the native function, which they carry (``originals.carries``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from .. import api
from ..compile import emitters, factories, graph_compile
from ..compile.table import EntryKind, Phase
from ..fx.meta import drop_leaked_stream_annotation
from ..originals import carries

log = logging.getLogger("torch_userstreams")
DYNAMO = "dynamo"
TORCH = "torch"  # a request from torch's own code (Dynamo, AOTAutograd) while compiling
FORWARD = Phase.FORWARD


def source_name(source: Any) -> str:
    """A Dynamo source as the user's code reaches it (``L['s']``): a method up to torch
    2.13, a property after."""
    name = source.name
    return name() if callable(name) else str(name)


def register_user_object(value: Any, source: Any) -> int:
    """An object Dynamo can load from the frame (input, global, ambient stream)."""
    from torch._dynamo.source import CurrentStreamSource

    table = graph_compile.current("Dynamo's register_user_object").table
    if isinstance(source, CurrentStreamSource):
        emit = emitters.current_stream(source.device)
        return table.add_current_stream(source.device, emit, value, added_by=DYNAMO)
    emit = emitters.from_source(source)
    return table.add(EntryKind.INPUT, source_name(source), emit, value, added_by=DYNAMO)


class ConstructSpec:
    """What the user's function called to create a stream or event, kept as constants.

    Replaces Dynamo's construct closures so that the prologue can build the object with a
    one-call factory, without native's ``stash_graph_created_object`` (which appends every
    call's objects to a global keep-alive list).
    """

    def __init__(self, kind: str, args: Any, kwargs: Any) -> None:
        self.kind = kind
        self.args: tuple[Any, ...] = tuple(args.as_python_constant())
        self.kwargs: dict[str, Any] = dict(kwargs.as_python_constant())

    def text(self) -> str:
        parts = [repr(a) for a in self.args]
        parts += [f"{k}={v!r}" for k, v in self.kwargs.items()]
        return f"torch.{self.kind}({', '.join(parts)})"

    def __call__(self, index: int, codegen: Any) -> None:
        """Native call shape: emit the construction (only if native code asks us to)."""
        cls = torch.Stream if self.kind == "Stream" else torch.Event
        probe = cls(*self.args, **self.kwargs)
        emitters.from_factory(factories.factory_for(probe, self.args, self.kwargs))(codegen)


def make_construct_in_graph_stream_fn(args: Any, kwargs: Any) -> ConstructSpec:
    return ConstructSpec("Stream", args, kwargs)


def make_construct_in_graph_event_fn(args: Any, kwargs: Any) -> ConstructSpec:
    return ConstructSpec("Event", args, kwargs)


def register_graph_created_object(example_value: Any, construct_fn: Any) -> int:
    """An object the user's function creates: rebuilt fresh on every call, as eager does."""
    table = graph_compile.current("Dynamo's register_graph_created_object").table
    if isinstance(construct_fn, ConstructSpec):
        factory = factories.factory_for(example_value, construct_fn.args, construct_fn.kwargs)
        return table.add(
            EntryKind.GRAPH_CREATED,
            f"{construct_fn.text()} in the function",
            emitters.from_factory(factory),
            example_value,
            added_by=DYNAMO,
        )
    # A native construction path we do not know: emit its own bytecode unchanged.
    log.warning(
        "torch_userstreams: unknown construction of %r in graph %s; using Dynamo's own "
        "bytecode for it (its objects are kept alive by native's keep_alive list)",
        example_value,
        table.graph_name,
    )
    index = len(table)

    def emit(cg: Any) -> None:
        construct_fn(index, cg)

    origin = f"{type(example_value).__name__} (native constructor)"
    return table.add(EntryKind.GRAPH_CREATED, origin, emit, example_value, added_by=DYNAMO)


def new_stream(*args: Any, **kwargs: Any) -> int:
    """Replacement for Dynamo's ``new_stream``: a stream torch asks for while compiling,
    with ``torch.Stream``'s arguments."""

    def request(device: Any = None, priority: int = 0) -> int:
        compile_ = graph_compile.current("Dynamo's new_stream")
        return api.request_stream(compile_, device, priority, added_by=TORCH, phase=FORWARD)

    return request(*args, **kwargs)


def new_event(*args: Any, **kwargs: Any) -> int:
    """Replacement for Dynamo's ``new_event``: an event torch asks for while compiling, with
    ``torch.Event``'s arguments."""

    def request(device: Any = None, **flags: bool) -> int:
        compile_ = graph_compile.current("Dynamo's new_event")
        return api.request_event(compile_, device, flags, added_by=TORCH, phase=FORWARD)

    return request(*args, **kwargs)


def get_current_stream(device: torch.device) -> int:
    """Replacement for Dynamo's ``get_current_stream``: one entry per device, always loaded."""
    compile_ = graph_compile.current("Dynamo's get_current_stream")
    return compile_.current_stream(factories.resolve_device(device), added_by=TORCH)


def wrap_reset(native: Callable[[], None]) -> Callable[[], None]:
    """The replacement for ``reset_user_object_tracking``, called as Dynamo starts a frame:
    native's tables reset as before, the frame gets a fresh compile, and a stream
    annotation leaked by an earlier trace is dropped."""

    @carries(native)
    def reset_user_object_tracking() -> None:
        graph_compile.begin_frame()
        _drop_leaked_stream_annotation()
        native()

    return reset_user_object_tracking


def _drop_leaked_stream_annotation() -> None:
    """No frame compile starts inside a stream context, so any stream annotation set here
    leaked from an earlier trace (``fx.meta.drop_leaked_stream_annotation``)."""
    leaked = drop_leaked_stream_annotation()
    if leaked is not None:
        log.warning(
            "torch_userstreams: dropped the stream annotation %r that an earlier, failed "
            "trace left behind",
            leaked,
        )


def has_user_objects() -> bool:
    """Seen by ``OutputGraph``: False, so native emits no prologue of its own.

    The package's registrations never reach native's tables; if something did, the graph's
    hook reports it instead of emitting a stale native prologue.
    """
    return False
