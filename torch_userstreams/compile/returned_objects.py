"""Returning a graph's own stream or event to the caller, after the graph call.

Dynamo reconstructs a stream or event the function created (and returns) in the bytecode
after the graph call, by looking up its index. With per-call bindings that call has already
returned, so we emit ``run.lookup.returned_object(index)``, which reads the binding of the
call that just returned on this thread, instead of the global lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..originals import carries
from . import graph_compile

RUN_LOOKUP_MODULE = "torch_userstreams.run.lookup"


def wrap_reconstruct(native: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """The replacement for ``StreamVariable.reconstruct`` / ``EventVariable.reconstruct``."""

    @carries(native)
    def reconstruct(self: Any, codegen: Any) -> None:
        index = getattr(self, "user_object_index", None)
        if getattr(self, "source", None) is not None or index is None:
            native(self, codegen)
            return
        from torch._dynamo.bytecode_transformation import create_call_function

        codegen.add_push_null(
            lambda: codegen.load_import_from(RUN_LOOKUP_MODULE, "returned_object")
        )
        codegen.append_output(codegen.create_load_const(index))
        codegen.extend_output(create_call_function(1, False))
        graph_compile.for_output_graph(codegen.tx.output).mark_returns_objects()

    return reconstruct
