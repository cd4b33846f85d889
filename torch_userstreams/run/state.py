"""This thread's compiled calls and compiles: the state every run-time module reads.

One thread-local read finds it; its slots are cheap. Nothing per call is process-global:
another thread has its own.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol


class ExampleSource(Protocol):
    """A graph being traced or compiled: lookups made meanwhile get its example objects."""

    def example(self, index: int) -> Any: ...


class Compile(ExampleSource, Protocol):
    """What the run-time layer asks of a compile on this thread's stack."""

    backend_running: bool

    def traced_now(self) -> bool: ...


class Calls:
    """This thread's compiled calls."""

    __slots__ = ("__weakref__", "current", "exported", "last", "pending")

    def __init__(self) -> None:
        # The binding of the innermost call running on this thread; each call restores the
        # one it found (its caller's, for a compiled call nested in another).
        self.current: tuple[Any, ...] | None = None
        # Written by the prologue bytecode, taken by the graph call right after it.
        self.pending: tuple[Any, ...] | None = None
        # The binding of the last call that returned on this thread: the bytecode right
        # after a graph call (returning a graph-created stream) still reads it.
        self.last: tuple[Any, ...] | None = None
        # Strict torch.export re-runs the last exported graph after Dynamo's compile has
        # closed, outside any call: its lookups resolve to that graph's example objects.
        self.exported: ExampleSource | None = None


# Every live thread's ``Calls`` (one entry per thread, dropped with the thread), so that
# ``uninstall()`` can let the calls running on other threads finish first.
_every_thread_calls: weakref.WeakSet[Calls] = weakref.WeakSet()
_registry_lock = threading.Lock()


class ThreadState(threading.local):
    def __init__(self) -> None:
        self.calls = Calls()
        with _registry_lock:
            _every_thread_calls.add(self.calls)
        # The graphs being traced or compiled on this thread, innermost last (pushed and
        # popped by the compile layer).
        self.compiles: list[Compile] = []


state = ThreadState()


def compile_in_progress() -> Compile | None:
    """The compile that registrations and lookups made right now belong to: the innermost
    whose backend runs on this thread or whose frame Dynamo compiles now. Innermost: a
    backend that calls another compiled function compiles that function's frame inside it."""
    for compile_ in reversed(state.compiles):
        if compile_.backend_running or compile_.traced_now():
            return compile_
    return None


def forget_thread_state() -> None:
    """Drop what this thread keeps past a call or compile (on ``uninstall()``)."""
    state.calls.last = None
    state.calls.exported = None
    state.compiles.clear()


def wait_for_calls_on_other_threads(timeout_s: float = 10.0) -> bool:
    """Wait until the compiled call each other thread is running now has returned.

    A call reads the install state once, as it starts; ``uninstall()`` flips that state
    first and then waits here, so a forward running on another thread does not lose the
    patches it resolves its objects through halfway. What is waited for is each thread's
    innermost call; the outer call of a nested pair, and a backward in progress, are not
    tracked. Returns False if some call was still running after ``timeout_s``.
    """
    own = state.calls
    with _registry_lock:
        running = [(c, c.current) for c in _every_thread_calls if c is not own and c.current]
    deadline = time.monotonic() + timeout_s
    while running:
        running = [(c, b) for c, b in running if c.current is b]
        if running and time.monotonic() > deadline:
            return False
        if running:
            time.sleep(0.0005)
    return True


def never_trace(*functions: Callable[..., Any]) -> None:
    """The prologue calls these from compiled bytecode: Dynamo must not try to compile them."""
    from torch._dynamo.eval_frame import skip_code

    for fn in functions:
        skip_code(fn.__code__)
