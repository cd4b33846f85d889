"""Per-call binding of user objects, and the lookup every compiled graph reads them with.

The prologue of a call builds or loads that call's objects and hands them to the graph's
``BoundGraph`` (``bind``); the ``BoundGraph`` then runs the compiled function with that
``Binding`` on top of a thread-local stack, so every ``lookup(i)`` made while it runs — FX
nodes, ``streams::*`` ops, Inductor's wrapper — resolves against *this* call. Nothing is
global: a nested compiled call pushes its own binding, another thread has its own stack,
and a backward finds the binding of the forward call it differentiates on its autograd node
(``backward.py``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .errors import UserObjectError
from .table import UserObjectTable

_WEAKREF = weakref.ReferenceType


class _ThreadState(threading.local):
    def __init__(self) -> None:
        self.stack: list[Binding] = []
        # The binding of the last call that returned on this thread: the bytecode right
        # after a graph call (returning a graph-created stream) still reads it.
        self.last: Binding | None = None
        self.pending: Binding | None = None
        # Strict torch.export re-runs the last exported graph after Dynamo's compile has
        # closed, outside any call: its lookups resolve to that graph's example objects.
        self.exported: UserObjectTable | None = None


_state = _ThreadState()


class Binding:
    """The objects of one call of one graph, in table order."""

    __slots__ = ("__weakref__", "graph", "objects")

    def __init__(self, graph: BoundGraph, objects: tuple[Any, ...]) -> None:
        self.graph = graph
        self.objects: tuple[Any, ...] | list[Any] = objects

    def resolve(self, index: int) -> Any:
        try:
            obj = self.objects[index]
        except (IndexError, TypeError):
            raise UserObjectError(
                f"torch_userstreams: graph {self.graph.table.graph_name} has no user object "
                f"at index {index} (its table has {len(self.objects)} entries). The index was "
                "registered for another graph; request objects through the compile being run."
            ) from None
        if type(obj) is _WEAKREF:
            obj = obj()
            if obj is None:
                self._dead(index)
        elif obj is None:
            self._unused(index)
        return obj

    def weaken_inputs(self) -> None:
        """Keep only what the call created: inputs stay owned by the user (for backward)."""
        entries = self.graph.table.entries
        objects = list(self.objects)
        for i, entry in enumerate(entries):
            if not entry.held_strongly and objects[i] is not None:
                objects[i] = weakref.ref(objects[i])
        self.objects = objects

    def _dead(self, index: int) -> None:
        entry = self.graph.table.entries[index]
        raise UserObjectError(
            f"torch_userstreams: user object {index} of graph {self.graph.table.graph_name} "
            f"({entry.kind.value} {entry.example_type}, {entry.origin}) is no longer alive "
            "when the backward needs it. Keep the stream/event alive until backward() has run."
        )

    def _unused(self, index: int) -> None:
        entry = self.graph.table.entries[index]
        raise UserObjectError(
            f"torch_userstreams: user object {index} of graph {self.graph.table.graph_name} "
            f"({entry.origin}) was not loaded by the prologue because no node of the graph "
            "read it at compile time. A backend that reads it must request it with "
            "torch_userstreams.current_stream() while compiling."
        )


class BoundGraph:
    """Wraps a compiled graph that has user objects: binds each call's objects around it."""

    __slots__ = ("__weakref__", "after_forward", "fn", "returns_objects", "table")

    def __init__(
        self,
        fn: Callable[..., Any],
        table: UserObjectTable,
        after_forward: Callable[[Binding, Any], bool] | None = None,
    ) -> None:
        self.fn = fn
        self.table = table
        self.after_forward = after_forward
        # Set when the bytecode after the call returns one of the call's objects: only then
        # does the thread keep this call's binding past the call (until its next call).
        self.returns_objects = False

    def bind(self, *objects: Any) -> None:
        """Called by the prologue, just before the graph call, with this call's objects."""
        _state.pending = Binding(self, objects)

    def __call__(self, *args: Any) -> Any:
        state = _state
        binding = state.pending
        if binding is None or binding.graph is not self:
            raise UserObjectError(
                f"torch_userstreams: graph {self.table.graph_name} was called without its "
                "prologue binding its user objects. Call the compiled function, not the "
                "graph stored in the frame's globals."
            )
        state.pending = None
        if not _native_lookup:
            _feed_native_table(binding)
        stack = state.stack
        stack.append(binding)
        try:
            out = self.fn(*args)
        finally:
            stack.pop()
        if self.returns_objects:
            state.last = binding
        if self.after_forward is not None and not self.after_forward(binding, out):
            self.after_forward = None  # this graph has no compiled backward to bind
        return out

    def __repr__(self) -> str:
        return f"BoundGraph({self.table.graph_name}, {len(self.table)} user objects)"


NativeLookup = Callable[[int], Any]
_native_lookup: list[NativeLookup] = []


def set_native_lookup(fn: NativeLookup | None) -> None:
    """Graphs compiled before install() still read native's table through ``lookup``."""
    _native_lookup.clear()
    if fn is not None:
        _native_lookup.append(fn)


# The forward call's binding, stored on its compiled backward node by ``backward.attach``.
BINDING_ATTR = "_torch_userstreams_binding"
_current_autograd_node = torch._C._current_autograd_node


def _backward_binding() -> Binding | None:
    node = _current_autograd_node()
    return None if node is None else getattr(node, BINDING_ATTR, None)


def _compile_time_table() -> UserObjectTable | None:
    from .registration import table_if_compiling

    return table_if_compiling()


def _feed_native_table(binding: Binding) -> None:
    """After ``uninstall()`` native ``streams::*`` ops read native's table: fill it too."""
    from torch._dynamo import graph_bytecode_inputs as native

    native.store_user_object_weakrefs(*(o for o in binding.objects if o is not None))


def lookup(index: int) -> Any:
    """The current call's user object at ``index``; usable as an FX node target."""
    state = _state
    stack = state.stack
    if stack:
        return stack[-1].resolve(index)
    binding = _backward_binding()
    if binding is not None:
        return binding.resolve(index)
    compile_table = _compile_time_table()
    if compile_table is not None:
        return compile_table.example(index)
    exported = state.exported
    if exported is not None:
        return exported.example(index)
    if _native_lookup:
        return _native_lookup[0](index)
    raise UserObjectError(
        f"torch_userstreams.lookup({index}) was called outside any compiled call: user "
        "objects are only bound while a compiled graph (or its backward) runs."
    )


def returned_object(index: int) -> Any:
    """The object at ``index`` of the call that just returned on this thread.

    The bytecode right after a graph call uses this to return a stream or event the graph
    created (``return y, torch.Stream(...)``); ``lookup`` only serves running calls.
    """
    binding = _state.last
    if binding is None:
        raise UserObjectError(
            f"torch_userstreams: no compiled call has returned on this thread, so user "
            f"object {index} cannot be returned from it."
        )
    return binding.resolve(index)


def set_exported(table: UserObjectTable | None) -> None:
    _state.exported = table


def forget_thread_state() -> None:
    """Drop what this thread keeps past a call (on ``uninstall()``)."""
    _state.last = None
    _state.exported = None


def _never_trace(*functions: Callable[..., Any]) -> None:
    """The prologue calls these from compiled bytecode: Dynamo must not try to compile them."""
    from torch._dynamo.eval_frame import skip_code

    for fn in functions:
        skip_code(fn.__code__)


_never_trace(BoundGraph.bind, BoundGraph.__call__, Binding.__init__, returned_object, lookup)
