"""Who watches simulated streams run: the hook a run-time race detector plugs into.

Simulated streams and events (``simulator``) tell the watcher of the running context every
stream they enter and leave and every sync made on them; code that runs work the dispatcher
never sees (a compiled graph's kernels) tells it each kernel with the tensors it reads and
writes (``kernel``: for compiled launchers; the race detector counts Inductor's compiled
calls itself). Nobody watches unless ``watching(observer)`` is active, and then only in that
context: the cost when nobody watches is one context-variable read per simulated sync and
one per compiled ``run.plan.Program`` call (``escape``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, Protocol

import torch


class Observer(Protocol):
    """What a watcher is told, in issue order, on the thread that issues it."""

    def enter(self, stream: torch.Stream) -> None:
        """Work issued from now on runs on ``stream`` (``with stream:``)."""

    def exit(self, stream: torch.Stream) -> None:
        """The ``with stream:`` block of ``stream`` ends."""

    def record(self, event: torch.Event, stream: torch.Stream | None) -> None:
        """``event`` snapshots the work issued on ``stream`` (None: the current stream)."""

    def wait(self, event: torch.Event, stream: torch.Stream | None) -> None:
        """Later work on ``stream`` (None: the current stream) waits for ``event``."""

    def wait_stream(self, waiting: torch.Stream, waited_on: torch.Stream) -> None:
        """Later work on ``waiting`` waits for everything issued on ``waited_on``."""

    def synchronize(self, obj: torch.Stream | torch.Event) -> None:
        """The host waits for ``obj``: later work on every stream comes after it."""

    def kernel(
        self, name: str, reads: Sequence[torch.Tensor], writes: Sequence[torch.Tensor]
    ) -> None:
        """A kernel the dispatcher did not see runs on the current stream."""

    def escape(self, values: Any) -> None:
        """The tensors in ``values`` leave compiled code: the caller owns their memory."""


_watcher: ContextVar[Observer | None] = ContextVar("torch_userstreams.watcher", default=None)


# ``watcher()``: the observer of the running context, if any. The context variable's own
# ``get``, so that asking costs simulated syncs one C call and no Python frame.
watcher: Callable[[], Observer | None] = _watcher.get


@contextlib.contextmanager
def watching(observer: Observer) -> Iterator[Observer]:
    """Tell ``observer`` what simulated streams do inside this block."""
    token = _watcher.set(observer)
    try:
        yield observer
    finally:
        _watcher.reset(token)


# Set on a compiled graph whose outputs go to the package's compiled program (a region of
# ``run.plan.Program``), which tells the observer what escapes from the whole program.
_IN_A_PROGRAM = "_torch_userstreams_in_a_program"


def part_of_a_program(compiled: Any) -> None:
    """``compiled`` runs as one step of a compiled program: its outputs do not escape. (Only
    Inductor's compiled graphs are asked; another compiler's result may refuse the mark.)"""
    with contextlib.suppress(AttributeError, TypeError):
        setattr(compiled, _IN_A_PROGRAM, True)


def outputs_escape(compiled: Any) -> bool:
    """Whether what ``compiled`` returns is its caller's (it is no step of a program)."""
    return not getattr(compiled, _IN_A_PROGRAM, False)


def tensors_in(values: Any) -> list[torch.Tensor]:
    """The tensors among ``values`` (nested lists and tuples included)."""
    found: list[torch.Tensor] = []
    todo = [values]
    while todo:
        value = todo.pop()
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            todo.extend(value)
    return found
