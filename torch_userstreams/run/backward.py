"""Give each backward the binding of the forward call it differentiates.

AOTAutograd runs a compiled graph's backward as one autograd node
(``CompiledFunctionBackward``, a Python object); higher-order ops run eagerly (``torch.cond``,
checkpointing) make Python nodes of their own. After a forward call that made autograd
nodes (reached from its outputs, or from an input it mutated in place), we store the
call's binding on every Python node the call made; ``backward_binding`` finds the node
that runs its caller (the engine's current node, or the innermost ``apply`` frame), whatever
thread runs the backward, with no state to clean up if it fails. The package's own backward
programs ask once per run; ``lookup`` asks for anything else. The nodes hold the binding,
so the objects of the call (its inputs included) live exactly as long as its autograd
graph, as in eager.

Which nodes the call made: those whose autograd sequence number falls in the range the
call used on this thread. The walk from the outputs stops at older nodes, so it never
reaches (or relabels) another call's nodes, however many views sit between an output and
its compiled node; and at the nodes of the call's inputs, since sequence numbers count per
thread and a node made on another thread may carry one of the call's numbers.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction

from . import native
from .binding import Binding

# The forward call's binding, on each Python autograd node the call made. This module writes
# it (``attach``) and reads it (``backward_binding``).
BINDING_ATTR = "_torch_userstreams_binding"
_current_autograd_node = torch._C._current_autograd_node


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for item in out:
            if isinstance(item, torch.Tensor):
                yield item


def nodes_made(
    out: Any, first: int, last: int, inputs: tuple[Any, ...] | None = None
) -> Iterator[Any]:
    """The autograd nodes behind ``out`` with sequence numbers in [first, last): the nodes a
    call made on this thread, given the range it used and its ``inputs``.

    Sequence numbers count per thread, so a node another thread made may carry one of the
    call's numbers. From the call's outputs (never an input itself: Dynamo returns an input
    from the frame, not from the graph) such a node is only reached through an input's node,
    where the walk stops: every node it yields is the call's, and it stops once it found
    ``last - first`` of them, the most the range holds (a call that made one node never
    lists the parameters' nodes behind it). Walking from the inputs themselves
    (``inputs=None``: an input the call mutated in place) it can do neither.

    Nodes are told apart by identity: a C++ node keeps one Python object while a reference
    to it lives, and the walk holds every node it visits. A call that made one node (a
    compiled graph's) is most often an output's own node: that one is yielded with no walk.
    """
    made = -1 if inputs is None else last - first
    if made == 1:  # the common case (one compiled node): an output's own node, if any
        for tensor in _tensors(out):
            node = tensor.grad_fn
            if node is not None and node._sequence_nr() == first:
                yield node
                return
    todo = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
    visited: set[Any] = set()
    stops: set[Any] | None = None  # the inputs' nodes, looked up before the first step back
    while todo:
        node = todo.pop()
        if node in visited or not first <= node._sequence_nr() < last:
            continue
        visited.add(node)
        if stops is not None and node in stops:
            continue
        yield node
        made -= 1
        if made == 0:
            return
        if stops is None and inputs is not None:
            stops = {t.grad_fn for t in _tensors(inputs)}
        todo.extend(fn for fn, _ in node.next_functions if fn is not None)


# The frames a Python autograd node runs in: ``apply`` (torch 2.11, and a node the user
# applies directly) or ``apply_boxed`` (the engine, torch 2.12+). Compared by identity: a
# code object hashes its constants, and code Dynamo generates can hold a dict.
_APPLY_CODES = tuple(
    getattr(BackwardCFunction, name).__code__
    for name in ("apply", "apply_boxed")
    if hasattr(BackwardCFunction, name)
)


def backward_binding(*, inside_apply: bool = False) -> Binding | None:
    """The binding of the forward call whose backward runs the caller: the one place a
    backward finds it.

    Any caller (a lookup, a pre-hook) is named by the engine's current node; outside the
    engine (a node the user applies directly), by the innermost autograd ``apply`` frame
    on this thread's stack. A caller ``inside_apply`` (the package's backward programs,
    which the node's own ``apply`` calls with no engine in between) is named by that frame
    first: it is the node running them even when the user applies it directly from a hook
    the engine runs for another node, where the engine's current node is that other one.
    The walk stops at the innermost apply even when its node has no binding.
    """
    if not inside_apply:
        node = _current_autograd_node()
        if node is not None:
            return getattr(node, BINDING_ATTR, None)
    frame = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        for apply_code in _APPLY_CODES:
            if code is apply_code:
                return getattr(frame.f_locals.get("self"), BINDING_ATTR, None)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def attach(
    binding: Binding, out: Any, first: int, last: int, inputs: tuple[Any, ...] | None
) -> bool:
    """Make the backward of this call resolve user objects against ``binding`` (its nodes:
    ``nodes_made``).

    Returns False when the call made no Python autograd node (a backend without
    AOTAutograd, or one that ran this call eagerly): its C++ nodes run no lookup.
    """
    attached = False
    for node in nodes_made(out, first, last, inputs):
        if not isinstance(node, BackwardCFunction):
            continue  # a C++ node: it runs no user-object lookup
        attached = True
        if getattr(node, BINDING_ATTR, None) is None:  # a nested call's: keep it
            setattr(node, BINDING_ATTR, binding)
            node.register_prehook(_feed_native_if_uninstalled)
    return attached


def _feed_native_if_uninstalled(grad_outputs: Any) -> None:
    """After ``uninstall()``, native ops read native's table: give it this call's objects."""
    if native.fill_native_table:
        binding = backward_binding()
        if binding is not None:
            native.feed(binding)
