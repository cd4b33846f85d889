"""Bytecode emitters: how the prologue pushes one entry's object for a call.

Each emitter takes Dynamo's ``PyCodegen`` of the frame and appends instructions that leave
exactly one object on the stack. They run when the prologue is generated, after the
backend returned; nothing here runs per call except the instructions they emit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .table import Emitter

FACTORY_GLOBAL = "__userstreams_factory"


def from_source(source: Any) -> Emitter:
    """Load an object the frame already has (argument, global, attribute chain)."""

    def emit(cg: Any) -> None:
        cg(source)

    return emit


def from_factory(factory: Callable[[], Any]) -> Emitter:
    """Call a zero-argument factory, installed as a global of the frame."""

    def emit(cg: Any) -> None:
        from torch._dynamo.bytecode_transformation import create_call_function

        name = cg.tx.output.install_global(FACTORY_GLOBAL, factory)
        cg.add_push_null(lambda: cg.append_output(cg.create_load_global(name, add=True)))
        cg.extend_output(create_call_function(0, False))

    return emit


def current_stream(device: Any) -> Emitter:
    """The ambient current stream of ``device`` at call time."""
    from torch._dynamo.source import CurrentStreamSource

    return from_source(CurrentStreamSource(device))


def placeholder(cg: Any) -> None:
    """An entry no node reads: keep its index, load nothing but None."""
    cg.append_output(cg.create_load_const(None))
