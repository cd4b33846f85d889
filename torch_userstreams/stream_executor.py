"""Run an FX graph node by node, each on the stream its annotation names.

Native ``aot_eager`` ignores stream annotations (everything runs on the current stream), so
it cannot show stream bugs. This executor enters each node's stream (resolved through the
current call's binding) around that node, and runs the sync nodes as they are.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from .passes.annotations import stream_of
from .runtime import lookup


class StreamInterpreter(torch.fx.Interpreter):
    """An ``fx.Interpreter`` that switches to each node's annotated stream."""

    def run_node(self, n: torch.fx.Node) -> Any:
        index = stream_of(n)
        if index is None or n.op != "call_function":
            return super().run_node(n)
        with lookup(index):
            return super().run_node(n)


def compile_with_streams(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
    """An AOTAutograd forward/backward compiler: a boxed callable over the interpreter."""
    interpreter = StreamInterpreter(gm)

    def run(args: list[Any]) -> Any:
        values = list(args)
        args.clear()  # boxed calling convention: the callee owns the inputs
        return interpreter.run(*values, enable_io_processing=False)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run
