"""Returning a graph's own stream or event to the caller, after the graph call.

Dynamo reconstructs a stream or event the function created (and returns) in the bytecode
after the graph call, by looking up its index. With per-call bindings that call has already
returned, so we emit ``runtime.returned_object(index)``, which reads the binding of the call
that just returned on this thread, instead of the global lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RUNTIME_MODULE = __name__.rsplit(".", 1)[0] + ".runtime"
# Set by the OutputGraph hook: the graph's BoundGraph, so the epilogue can tell it to keep
# its last binding for ``returned_object``.
BOUND_ATTR = "_torch_userstreams_bound"
RETURNS_ATTR = "_torch_userstreams_returns_objects"


def mark_returns_objects(output_graph: Any) -> None:
    """Tell the graph's BoundGraph to keep its binding for the epilogue.

    Dynamo may generate this code before or after the backend compile (which creates the
    BoundGraph), so the flag is left on the OutputGraph too and read when it is created.
    """
    state = vars(output_graph)
    state[RETURNS_ATTR] = True
    bound = state.get(BOUND_ATTR)
    if bound is not None:
        bound.returns_objects = True


def wrap_reconstruct(native: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """The replacement for ``StreamVariable.reconstruct`` / ``EventVariable.reconstruct``."""

    def reconstruct(self: Any, codegen: Any) -> None:
        index = getattr(self, "user_object_index", None)
        if getattr(self, "source", None) is not None or index is None:
            native(self, codegen)
            return
        from torch._dynamo.bytecode_transformation import create_call_function

        codegen.add_push_null(lambda: codegen.load_import_from(RUNTIME_MODULE, "returned_object"))
        codegen.append_output(codegen.create_load_const(index))
        codegen.extend_output(create_call_function(1, False))
        mark_returns_objects(codegen.tx.output)

    reconstruct.__wrapped__ = native  # type: ignore[attr-defined]
    return reconstruct
