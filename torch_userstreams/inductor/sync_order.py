"""Inductor's scheduler keeps every sync where the graph put it: no work crosses a sync.

Inductor 2.12+ orders a sync (a ``control_deps`` node) after the work it names, and a wait
after its record. What orders the work *after* a sync after it differs by release: 2.12
nothing, 2.13 only the readers of what a ``wait_stream`` passes through, 2.14+ the readers
of what any sync passes through, never work that reads only values the sync does not pass
(a graph input, a value of the other phase). On 2.13 the scheduler moved a side stream's
kernel above the wait that orders it after the current stream (a backward read its incoming
gradient before the current stream had made it), and the race detector saw it on most
generated programs with a sync in their backward. While installed, Inductor orders each
graph's operations so that a sync follows every operation lowered before it and precedes
every one lowered after it (lowering follows the graph's order; an operation that makes no
buffer cannot be named, and is not fenced before the next sync); between two syncs it
schedules, fuses and reorders as it likes. That is the order the package's region path
always issued, at no cost on the host at run time.

Inductor's C++ backend then gathers consecutive nodes into one kernel and writes its call
when it is flushed, while it writes a sync at once: ``x * 3`` before a record and its
``.cos()`` after a wait became one kernel called after the wait, with its input freed
before it (``UnboundLocalError``). Each sync flushes what was gathered before it
(``flushed_at_syncs``), as Inductor does at a device guard: the kernel, not the frees
(2.11 freed a ``sync_dealloc``'s own buffer before it, in a graph its code left on one
stream).

On torch 2.11, what a sync must follow is computed before it where the package places
the graph's nodes on their streams (``placed_streams.wrap_run_node``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ..fx.ops import is_sync_op
from ..originals import carries, shadowed

Init = Callable[[Any, list[Any]], None]


def is_sync(operation: Any) -> bool:
    """Whether an Inductor operation issues a stream sync (a ``streams::*`` fallback)."""
    return is_sync_op(getattr(operation, "op_overload", None))


def fences(operations: Sequence[tuple[str, Sequence[str], bool]]) -> dict[str, list[str]]:
    """For operations in graph order (each its name, the buffers it makes, and whether it
    is a sync), the buffers of earlier operations each must follow: a sync follows every
    operation since the sync before it, and that sync; any other operation follows the
    last sync before it. Inductor names an ordering by the buffers of the earlier
    operation (a sync makes an empty one)."""
    after: dict[str, list[str]] = {}
    last_sync: Sequence[str] = ()
    since: list[str] = []
    for name, buffers, sync in operations:
        if sync:
            after[name] = [*since, *last_sync]
            last_sync, since = buffers, []
        else:
            after[name] = list(last_sync)
            since += buffers
    return {name: deps for name, deps in after.items() if deps}


def wrap_init(native: Init) -> Init:
    """The replacement of ``Scheduler._init``: each sync fenced in (``fences``) through
    Inductor's own ordering-only dependencies, then native's scheduling."""

    @carries(native)
    def _init(self: Any, nodes: list[Any]) -> None:
        if any(is_sync(node) for node in nodes):
            from torch._inductor.virtualized import V

            operations = [
                (
                    node.get_operation_name(),
                    [buffer.get_name() for buffer in node.get_outputs()],
                    is_sync(node),
                )
                for node in nodes
            ]
            extra = V.graph.additional_buffer_deps
            for name, deps in fences(operations).items():
                extra[name].update(deps)
        native(self, nodes)

    return _init


@contextlib.contextmanager
def flushed_at_syncs(scheduler: Any, nodes: list[Any]) -> Iterator[None]:
    """While ``scheduler`` writes the code of ``nodes``: the kernel gathered before each sync
    written before it (see the module docstring)."""
    if not any(is_sync(getattr(node, "node", None)) for node in nodes):
        yield
        return
    native = scheduler.codegen_extern_call

    def codegen_extern_call(node: Any) -> None:
        if is_sync(node.node):
            # The kernel, not the frees: the sync's own operands (a ``sync_dealloc``'s
            # buffer) are among the buffers the scheduler frees at its next flush.
            for backend in scheduler.backends.values():
                backend.flush()
        native(node)

    with shadowed(scheduler, {"codegen_extern_call": codegen_extern_call}):
        yield
