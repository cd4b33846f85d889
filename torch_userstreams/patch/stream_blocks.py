"""``with stream:`` blocks in a compiled function: the name they bind, and nesting.

* ``with stream as s:`` binds the stream. ``torch.Stream.__enter__`` returns the stream
  itself, but Dynamo traces a stream's block with the handler it shares with
  ``torch.cuda.StreamContext`` (whose ``__enter__`` returns None), so natively the name is
  bound to None: code that records on it fails far from the cause, and a function returning
  it returns None, silently. A ``torch.cuda.stream(s)`` context still binds None, as in eager.
* ``with s:`` inside ``with s:`` (say, a module and the helper it calls both making sure
  they run on the side stream) runs on ``s``, as in eager. Dynamo keeps one exit hook per
  stream variable, so natively entering the same one twice fails with ``AssertionError:
  multiple exits?``. The inner block of the stream already current only pushes it on Dynamo's
  stream stack; its nodes carry the outer block's annotation, which names the same stream.
  Re-entering a stream while another one is current, or inside the body of a higher-order
  op (a ``torch.cond`` branch, a ``nested_compile_region``), breaks the graph with an
  explanation instead: there the annotation would need a second exit hook, and a body's
  inner block would be invisible to the package's subgraph check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..compile import graph_compile
from ..originals import carries
from .replacements import source_name

Handler = Callable[..., Any]
GRAPH_BREAK_TYPE = "torch_userstreams: a stream entered again inside its own block"


def wrap_enter(native: Handler) -> Handler:
    """``StreamContextVariable.enter`` that returns the stream entered when it is one and
    lets a stream's block nest inside its own."""

    @carries(native)
    def enter(self: Any, tx: Any, *args: Any) -> Any:
        from torch._dynamo.variables.streams import StreamVariable

        if not isinstance(self, StreamVariable):
            return native(self, tx, *args)
        if getattr(self, "cleanup_fn", None) is None:  # not inside a block of this stream
            native(self, tx, *args)
        else:
            _reenter(self, tx)
        return self

    return enter


def wrap_exit(native: Handler) -> Handler:
    """``StreamContextVariable.exit`` that leaves a nested block of the same stream
    without running the outer block's exit hook."""

    @carries(native)
    def exit(self: Any, tx: Any, *args: Any) -> Any:
        from torch._dynamo.variables import ConstantVariable
        from torch._dynamo.variables.streams import StreamVariable

        if not isinstance(self, StreamVariable):
            return native(self, tx, *args)
        reentered = graph_compile.for_output_graph(tx.output).reentered_streams
        depth = reentered.pop(id(self), 0)
        if depth == 0:
            return native(self, tx, *args)
        if depth > 1:
            reentered[id(self)] = depth - 1
        tx.symbolic_stream_state.exit_stream()
        return ConstantVariable.create(None)

    return exit


def _reenter(stream: Any, tx: Any) -> None:
    state = tx.symbolic_stream_state
    if state.cur_stream() is not stream:
        _graph_break(
            stream,
            "while the innermost block is not this stream's (another stream's block, or a "
            "block of a stream reached another way, such as torch.accelerator."
            "current_stream()). Dynamo cannot resume inside a `with stream:` block, so the "
            "function's own code runs eagerly (functions it calls may still compile; with "
            "fullgraph=True, this is an error).",
        )
    if tx.output.current_tracer.parent is not None:
        _graph_break(stream, "inside the body of a higher-order op (torch.cond, a region).")
    state.enter_stream(stream)
    reentered = graph_compile.for_output_graph(tx.output).reentered_streams
    reentered[id(stream)] = reentered.get(id(stream), 0) + 1


def _graph_break(stream: Any, where: str) -> None:
    from torch._dynamo.exc import unimplemented

    if stream.source is None:
        name, block = "a stream the function made", "the inner block of that stream"
    else:
        name = source_name(stream.source)
        block = f"the inner `with {name}:`"
    unimplemented(
        gb_type=GRAPH_BREAK_TYPE,
        context=name,
        explanation=(
            f"A stream's block ({name}) nested in a block of the same stream compiles when "
            "it is the innermost stream block, outside higher-order op bodies; here it is "
            f"entered again {where}"
        ),
        hints=[f"Drop {block}: its code already runs on that stream."],
    )
