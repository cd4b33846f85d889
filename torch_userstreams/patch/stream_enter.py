"""``with stream as s:`` binds the stream in a compiled function, as it does in eager.

``torch.Stream.__enter__`` returns the stream itself. Dynamo traces a stream's block with
the handler it shares with ``torch.cuda.StreamContext``, whose ``__enter__`` returns None,
so the name is bound to None: code that records on it fails far from the cause, and a
function that returns it returns None, silently. The replacement gives the stream's own
variable back when the context is a stream; a ``torch.cuda.stream(s)`` context still binds
None, as in eager.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Enter = Callable[..., Any]


def wrap_enter(native: Enter) -> Enter:
    """``StreamContextVariable.enter`` that returns the stream entered when it is one."""

    def enter(self: Any, tx: Any, *args: Any) -> Any:
        from torch._dynamo.variables.streams import StreamVariable

        entered = native(self, tx, *args)
        return self if isinstance(self, StreamVariable) else entered

    return enter
