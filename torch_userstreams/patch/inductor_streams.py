"""Inductor's generated code defines the user streams it enters, on every device.

Inductor 2.12+ runs each node of a graph with user streams on its stream: the generated
``call`` enters ``with stream1:`` (``with default_stream:`` to go back), and defines those
names only where it enters a GPU device guard. Code for CPU tensors (plain CPU streams, the
simulator, the fake accelerator) enters no guard, so each of its calls failed with
``NameError: name 'stream1' is not defined``, natively too. While installed, the code of a
graph with streams defines them at its start, whatever its devices:

* ``streamN``: the call's user object (``get_external_object_by_index``, the package's
  lookup: the stream of *this* call);
* ``default_stream``: a null context. Inductor leaves one stream's block before it enters
  the next, so the stream current where it enters ``default_stream`` is the one the call
  began on.

A GPU graph's device guard defines them again, to the same streams and its current stream,
so the CPU suite runs the lines a GPU's code starts with.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..originals import carries

_IMPORTS = (
    "from contextlib import nullcontext",
    "from torch._dynamo.graph_bytecode_inputs import get_external_object_by_index",
)
# Inductor's own names (``torch._inductor.stream_constants``), the same in 2.12-2.15.
DEFAULT_STREAM = "default_stream"
STREAM_NAME = "stream{}"

Codegen = Callable[[Any, list[Any]], None]


def definitions(stream_objects: dict[int, int]) -> list[str]:
    """The lines that define ``default_stream`` and each ``streamN`` Inductor enters, from
    its map of stream number to table index."""
    lines = [f"{DEFAULT_STREAM} = nullcontext()"]
    lines += [
        f"{STREAM_NAME.format(number)} = get_external_object_by_index({index})"
        for number, index in sorted(stream_objects.items())
    ]
    return lines


def wrap_codegen(native: Codegen) -> Codegen:
    """The replacement of ``Scheduler._codegen``: the definitions first, then native's code
    for the nodes (a graph with one stream, or C++ wrapper code, is left as it is)."""

    @carries(native)
    def _codegen(self: Any, nodes: list[Any]) -> None:
        from torch._inductor.virtualized import V

        wrapper = V.graph.wrapper_code
        if self._has_multi_stream_nodes() and not V.graph.cpp_wrapper:
            for line in _IMPORTS:
                if not wrapper.imports.contains(line):
                    wrapper.imports.writeline(line)
            for line in definitions(self.stream_idx_to_user_obj_idx):
                wrapper.writeline(line)
        native(self, nodes)

    return _codegen
