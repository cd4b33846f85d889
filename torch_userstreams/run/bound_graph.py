"""The per-call path of a compiled graph that has user objects.

The prologue of a call leaves the call's binding in this thread's ``pending`` slot; the
graph's ``BoundGraph`` takes it from there and runs the compiled function with it as the
thread's current binding, so every ``lookup(i)`` made meanwhile resolves against *this*
call, whatever other graphs or threads run. Then it hands the binding to the call's
backward (``after_forward``: ``backward.attach``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..errors import UserObjectError
from . import native
from .binding import Binding
from .state import never_trace, state

# Called after a call that made autograd nodes, with the call's binding, the values to walk
# from (its outputs, else its inputs), the sequence numbers of those nodes ([first, last)),
# and the call's inputs where the walk starts from its outputs (else None).
AfterForward = Callable[[Binding, Any, int, int, tuple[Any, ...] | None], bool]

# For a backend the package cannot see into (``compile.table.HandOver.WHILE_FOUND``): calls
# in a row whose autograd nodes are all C++ ones (the backend runs the graph eagerly) before
# the graph stops handing its bindings over, since the walk costs about 1 us per node made.
# A graph whose backward AOTAutograd traced never stops: each of its calls can make one.
CALLS_WITHOUT_A_PYTHON_NODE = 32


class BoundGraph:
    """Wraps a compiled graph that has user objects: runs each call with its binding.

    The frame calls ``run`` (a closure: cheaper to call than an instance's ``__call__``),
    which takes the binding the prologue left in this thread's ``pending`` slot.
    """

    __slots__ = (
        "__weakref__",
        "after_forward",
        "fn",
        "misses",
        "returns_objects",
        "run",
        "stops_handing_over",
        "table",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        table: Any,
        after_forward: AfterForward | None = None,
        *,
        stops_handing_over: bool = True,
    ) -> None:
        self.fn = fn
        self.table = table
        # Hands the call's binding to its backward; asked after each call that made autograd
        # nodes. With ``stops_handing_over``, only until CALLS_WITHOUT_A_PYTHON_NODE calls
        # in a row made none it could hold (``misses``); a backend's callable may run
        # eagerly for its first calls, so one miss does not decide.
        self.after_forward = after_forward
        self.stops_handing_over = stops_handing_over
        self.misses = 0
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
    thread = state
    fn = bound.fn
    next_sequence_nr = torch._C._autograd._get_sequence_nr

    def run(*args: Any) -> Any:
        calls = thread.calls
        binding = calls.pending
        if binding is None or binding[0] is not bound:
            raise bound.unbound_call()
        calls.pending = None
        if native.fill_native_table:
            native.feed(binding)
        outer = calls.current
        calls.current = binding
        first = next_sequence_nr()
        try:
            out = fn(*args)
        finally:
            calls.current = outer
        after_forward = bound.after_forward
        if after_forward is not None:
            last = next_sequence_nr()
            if last != first:  # the call made autograd nodes: hand the binding over
                _hand_over(bound, after_forward, binding, out, args, first, last)
        if bound.returns_objects:
            calls.last = binding
        return out

    never_trace(run)
    return run


def _carries_graph(values: Any) -> bool:
    for value in values:  # (a loop: no generator to make on each call)
        if isinstance(value, torch.Tensor) and value.grad_fn is not None:
            return True
    return False


def _hand_over(
    bound: BoundGraph,
    after_forward: AfterForward,
    binding: Binding,
    out: Any,
    args: tuple[Any, ...],
    first: int,
    last: int,
) -> None:
    """Give the call's binding to the autograd nodes it made, found from its outputs, else
    from its inputs (an input mutated in place hangs the call's backward on its own history,
    whatever the outputs carry). Where the graph may stop handing over, counts the calls in
    a row whose values carried a graph but led to no Python node the call made, and stops
    asking after too many."""
    missed = False
    outputs = out if type(out) is tuple or type(out) is list else (out,)
    for values, inputs in ((outputs, args), (args, None)):
        if _carries_graph(values):
            if after_forward(binding, values, first, last, inputs):
                bound.misses = 0
                return
            missed = True
    if missed and bound.stops_handing_over:
        bound.misses += 1
        if bound.misses >= CALLS_WITHOUT_A_PYTHON_NODE:
            bound.after_forward = None  # this graph makes no node to hold it
