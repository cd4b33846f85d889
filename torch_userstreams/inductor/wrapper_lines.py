"""The names and lines the package writes into Inductor's generated code, and how it reads
lines: shared by the modules that write stream blocks (``placed_streams``, 2.11), rewrite
them (``launch_code``) and judge the syncs between them (``sync_lines``).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

# The name of the call's user object at table index N in generated code (Inductor names no
# value so: its unbacked sizes are ``u0``, ``u1``...).
OBJECT_NAME = "user_object{}"
# Inductor's number for the stream the call began on (``stream_constants``, 2.12+).
CALLERS_STREAM = 0


@functools.cache
def block_lines() -> tuple[Any, Any]:
    """The wrapper lines that enter and leave a stream's block on 2.11 (``placed_streams``):
    ``with user_objectN:``, numbered as Inductor 2.12+ numbers its own blocks."""
    from torch._inductor.codegen.wrapper import WrapperLine

    @dataclasses.dataclass
    class EnterBlockLine(WrapperLine):
        stream_idx: int
        index: int  # the stream's table index

        def codegen(self, code: Any) -> None:
            code.writeline(f"with {OBJECT_NAME.format(self.index)}:")
            code.do_indent()

    @dataclasses.dataclass
    class ExitBlockLine(WrapperLine):
        def codegen(self, code: Any) -> None:
            code.do_unindent()

    return EnterBlockLine, ExitBlockLine


def block_kinds() -> tuple[Any, Any]:
    """The wrapper lines that enter a stream block, and those that leave one: Inductor's
    own (2.12+) and the package's (2.11, ``block_lines``)."""
    from torch._inductor.codegen import wrapper

    enter, leave = block_lines()
    if not hasattr(wrapper, "EnterCudaStreamContextLine"):
        return (enter,), (leave,)
    return (wrapper.EnterCudaStreamContextLine, enter), (wrapper.ExitCudaStreamContextLine, leave)


def writes_no_code(line: Any) -> bool:
    """Whether ``line`` writes no statement: a comment, a marker of where a node's code
    starts, or the definitions of the unbacked sizes of an operation that has none."""
    from torch._inductor.codegen.wrapper import CommentLine, UnbackedSymbolDefsLine
    from torch._inductor.utils import LineContext

    if isinstance(line, str):
        return not line.strip() or line.lstrip().startswith("#")
    if isinstance(line, UnbackedSymbolDefsLine):
        return not line.unbacked_bindings
    return isinstance(line, (CommentLine, LineContext))
