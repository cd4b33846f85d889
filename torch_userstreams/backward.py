"""Give each backward the binding of the forward call it differentiates.

AOTAutograd runs a compiled graph's backward as one autograd node
(``CompiledFunctionBackward``, a Python object). After a forward call whose outputs require
grad, we store the call's binding on that node; while the node runs, the autograd engine
reports it as the thread's current node, which is where ``lookup`` finds the binding —
whatever thread runs the backward, with no state to clean up if it fails. The node holds the
binding, so the objects the call created live exactly as long as its autograd graph (until
its backward ran and the graph was freed, or the graph is dropped without a backward), and
inputs are held weakly: a stream the user deleted gives a clear error, not a substitute.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from . import runtime

_COMPILED_BACKWARD = "CompiledFunctionBackward"
# Views and aliases of a compiled function's outputs are regenerated outside it; their
# autograd nodes sit a few steps above the compiled node.
_MAX_DEPTH = 4


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (list, tuple)):
        for item in out:
            if isinstance(item, torch.Tensor):
                yield item


def compiled_backward_nodes(out: Any) -> list[Any]:
    """The ``CompiledFunctionBackward`` nodes that the outputs ``out`` depend on directly."""
    found: dict[int, Any] = {}
    seen: set[int] = set()
    frontier = [t.grad_fn for t in _tensors(out) if t.grad_fn is not None]
    for _ in range(_MAX_DEPTH):
        next_frontier: list[Any] = []
        for node in frontier:
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if node.name().startswith(_COMPILED_BACKWARD):
                found[id(node)] = node
                continue
            next_frontier.extend(fn for fn, _ in node.next_functions)
        frontier = next_frontier
    return list(found.values())


def attach(binding: runtime.Binding, out: Any) -> runtime.Binding | None:
    """Make the backward of this call resolve user objects against ``binding``.

    Called after a forward whose outputs carry an autograd graph. Returns the binding the
    call keeps (inputs weakened, since a backward holds it), or None when there is no
    compiled backward node (a backend without AOTAutograd): the graph's structure is fixed,
    so the caller stops asking.
    """
    nodes = compiled_backward_nodes(out)
    if not nodes:
        return None
    binding = runtime.weakened(binding)
    for node in nodes:
        setattr(node, runtime.BINDING_ATTR, binding)
    return binding
