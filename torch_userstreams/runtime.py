"""Per-call binding of user objects, and the lookup every compiled graph reads them with.

The prologue of a call builds a ``Binding`` (the graph, then that call's objects) and
leaves it in this thread's ``pending`` slot; the graph's ``BoundGraph`` takes it from there
and runs the compiled function with it as the thread's current binding, so every
``lookup(i)`` made while it runs — FX nodes, ``streams::*`` ops, Inductor's wrapper —
resolves against *this* call. Nothing per call is global: a nested compiled call makes
its own binding current and restores the outer one, another thread has its own, and a
backward finds the binding of the forward call it differentiates on its autograd node
(``backward.py``). What native Dynamo's global table still needs (graphs compiled before
``install()``, native ops after ``uninstall()``) is in ``native.py``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

from . import native
from .errors import UserObjectError
from .table import UserObjectTable


class _Calls:
    """This thread's compiled calls. One thread-local read finds it; its slots are cheap."""

    __slots__ = ("current", "exported", "last", "pending")

    def __init__(self) -> None:
        # The binding of the innermost call running on this thread; each call restores the
        # one it found (its caller's, for a compiled call nested in another).
        self.current: Binding | None = None
        # Written by the prologue bytecode, taken by the graph call right after it.
        self.pending: Binding | None = None
        # The binding of the last call that returned on this thread: the bytecode right
        # after a graph call (returning a graph-created stream) still reads it.
        self.last: Binding | None = None
        # Strict torch.export re-runs the last exported graph after Dynamo's compile has
        # closed, outside any call: its lookups resolve to that graph's example objects.
        self.exported: UserObjectTable | None = None


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.calls = _Calls()


_state = _ThreadState()


def thread_state() -> threading.local:
    """The thread-local whose ``calls.pending`` slot the prologue bytecode writes."""
    return _state


# A call's binding is a plain tuple ``(graph, object 0, object 1, ...)``: the prologue
# builds it with one ``BUILD_TUPLE`` and no Python frame (a tuple subclass would cost a copy
# per call), and ``lookup(i)`` reads item ``i + 1``. An entry is None when the prologue did
# not load it, or a weak reference once a backward holds the binding (inputs only).
Binding = tuple[Any, ...]


def graph_of(binding: Binding) -> BoundGraph:
    return binding[0]  # type: ignore[no-any-return]


def objects_of(binding: Binding) -> tuple[Any, ...]:
    return binding[1:]


def resolve(binding: Binding, index: int) -> Any:
    """The object at table ``index`` of the call ``binding``; checked, with a clear error."""
    if type(index) is not int or not 0 <= index < len(binding) - 1:
        raise UserObjectError(
            f"torch_userstreams: graph {graph_of(binding).table.graph_name} has no user "
            f"object at index {index!r} (its table has {len(binding) - 1} entries). The index "
            "was registered for another graph; request objects through the compile being run."
        )
    obj = binding[index + 1]
    if obj is None:
        raise _unused(binding, index)
    return obj


def _unused(binding: Binding, index: int) -> UserObjectError:
    table = graph_of(binding).table
    entry = table.entries[index]
    return UserObjectError(
        f"torch_userstreams: user object {index} of graph {table.graph_name} "
        f"({entry.kind.value} {entry.example_type}, {entry.origin}) was not loaded by the "
        "prologue because no node of the graph read it at compile time. A backend that "
        "reads it must request it with torch_userstreams.current_stream() while compiling."
    )


# Called after a call whose outputs carry an autograd graph, with the call's binding, its
# outputs and the autograd sequence numbers of the nodes the call made ([first, last)).
AfterForward = Callable[[Binding, Any, int, int], bool]


class BoundGraph:
    """Wraps a compiled graph that has user objects: runs each call with its binding.

    The frame calls ``run`` (a closure: cheaper to call than an instance's ``__call__``),
    which takes the binding the prologue left in this thread's ``pending`` slot.
    """

    __slots__ = ("__weakref__", "after_forward", "fn", "returns_objects", "run", "table")

    def __init__(
        self,
        fn: Callable[..., Any],
        table: UserObjectTable,
        after_forward: AfterForward | None = None,
    ) -> None:
        self.fn = fn
        self.table = table
        # Hands the call's binding to its backward; returns False when the call made no
        # autograd node that could hold it (then it is never called again for this graph).
        self.after_forward = after_forward
        # Set when the bytecode after the call returns one of the call's objects: only then
        # does the thread keep this call's binding past the call (until its next call).
        self.returns_objects = False
        self.run = runner(self)

    def unbound_call(self) -> UserObjectError:
        return UserObjectError(
            f"torch_userstreams: graph {self.table.graph_name} was called without its "
            "prologue binding its user objects. Call the compiled function, not the "
            "graph stored in the frame's globals."
        )

    def __repr__(self) -> str:
        return f"BoundGraph({self.table.graph_name}, {len(self.table)} user objects)"


def runner(bound: BoundGraph) -> Callable[..., Any]:
    """The per-call path of ``bound``: take the pending binding, run the graph with it
    as the thread's current binding, then hand it to the backward (``after_forward``)."""
    state = _state
    fn = bound.fn
    tensor = torch.Tensor
    next_sequence_nr = torch._C._autograd._get_sequence_nr

    def run(*args: Any) -> Any:
        calls = state.calls
        binding = calls.pending
        if binding is None or binding[0] is not bound:
            raise bound.unbound_call()
        calls.pending = None
        if not native.installed:
            native.feed(binding)
        outer = calls.current
        calls.current = binding
        first = next_sequence_nr()
        try:
            out = fn(*args)
        finally:
            calls.current = outer
        if bound.after_forward is not None:
            # Only outputs that carry an autograd graph have a backward to hand over to.
            for item in out if type(out) is tuple or type(out) is list else (out,):
                if isinstance(item, tensor) and item.grad_fn is not None:
                    if not bound.after_forward(binding, out, first, next_sequence_nr()):
                        bound.after_forward = None  # this graph makes no node to hold it
                    break
        if bound.returns_objects:
            calls.last = binding
        return out

    _never_trace(run)
    return run


# The forward call's binding, stored on the autograd nodes it made by ``backward.attach``.
BINDING_ATTR = "_torch_userstreams_binding"
_current_autograd_node = torch._C._current_autograd_node


def _backward_binding() -> Binding | None:
    node = _current_autograd_node()
    return None if node is None else getattr(node, BINDING_ATTR, None)


def _compile_time_table() -> UserObjectTable | None:
    from .registration import table_if_compiling

    return table_if_compiling()


def lookup(index: int) -> Any:
    """The current call's user object at ``index``; usable as an FX node target.

    Resolved, in order, against: the compiled call running on this thread; the forward
    call whose backward is running; the graph being traced or compiled (its examples); the
    graph strict ``torch.export`` re-runs; native Dynamo's table, for a graph compiled
    before ``install()`` whose native prologue filled it. Anything else is an error.
    """
    binding = _state.calls.current
    if binding is not None:
        try:  # the common case, without calling resolve
            obj = binding[index + 1]
        except (IndexError, TypeError):
            obj = None
        if obj is not None and index >= 0:
            return obj
        return resolve(binding, index)
    backward_binding = _backward_binding()
    if backward_binding is not None:
        return resolve(backward_binding, index)
    compile_table = _compile_time_table()
    if compile_table is not None:
        return compile_table.example(index)
    exported = _state.calls.exported
    if exported is not None:
        return exported.example(index)
    found = native.object_at(index)
    if found is not None:
        return found
    raise UserObjectError(
        f"torch_userstreams.lookup({index!r}) was called outside any compiled call: user "
        "objects are only bound while a compiled graph (or its backward) runs."
    )


def returned_object(index: int) -> Any:
    """The object at ``index`` of the call that just returned on this thread.

    The bytecode right after a graph call uses this to return a stream or event the graph
    created (``return y, torch.Stream(...)``); ``lookup`` only serves running calls.
    """
    binding = _state.calls.last
    if binding is None:
        raise UserObjectError(
            f"torch_userstreams: no compiled call has returned on this thread, so user "
            f"object {index} cannot be returned from it."
        )
    return resolve(binding, index)


def set_exported(table: UserObjectTable | None) -> None:
    _state.calls.exported = table


def forget_thread_state() -> None:
    """Drop what this thread keeps past a call (on ``uninstall()``)."""
    _state.calls.last = None
    _state.calls.exported = None


def _never_trace(*functions: Callable[..., Any]) -> None:
    """The prologue calls these from compiled bytecode: Dynamo must not try to compile them."""
    from torch._dynamo.eval_frame import skip_code

    for fn in functions:
        skip_code(fn.__code__)


_never_trace(returned_object, lookup)
