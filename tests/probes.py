"""Test backends that request user objects while compiling and record what each call saw."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

import torch_userstreams

_records = threading.local()


def seen() -> list[tuple[Any, ...]]:
    """What the probe nodes of the calls made on this thread received, in order."""
    if not hasattr(_records, "calls"):
        _records.calls = []
    return _records.calls  # type: ignore[no-any-return]


def probe(*objects: Any) -> None:
    """Called by a probe node with the objects its lookups resolved to."""
    seen().append(objects)


def node_of(graph: torch.fx.Graph, op: str) -> torch.fx.Node:
    """The first node of kind ``op`` ("placeholder", "output", ...)."""
    return next(n for n in graph.nodes if n.op == op)


def _is_lookup(target: Any) -> bool:
    """Ours, or native Dynamo's (for graphs compiled without the package)."""
    return target is torch_userstreams.lookup or (
        getattr(target, "__module__", "") == "torch._dynamo.graph_bytecode_inputs"
        and getattr(target, "__name__", "") == "get_external_object_by_index"
    )


def insert_probe(gm: torch.fx.GraphModule, indices: list[int]) -> None:
    """Insert ``probe(lookup(i) for i in indices)`` right after the inputs.

    The lookups use the graph's own lookup function (native's in a native graph).
    """
    graph = gm.graph
    own = [n.target for n in graph.nodes if n.op == "call_function" and _is_lookup(n.target)]
    lookup = own[0] if own else torch_userstreams.lookup
    anchor = [n for n in graph.nodes if n.op == "placeholder"][-1]
    lookups = []
    for index in indices:
        with graph.inserting_after(anchor):
            anchor = graph.call_function(lookup, (index,))
        lookups.append(anchor)
    with graph.inserting_after(anchor):
        graph.call_function(probe, tuple(lookups))
    graph.lint()
    gm.recompile()


def requesting_backend(
    request: Callable[[], list[int]], inner: Callable[..., Any] | None = None
) -> Callable[..., Any]:
    """A backend that requests objects (``request()``), probes them, then runs ``inner``."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        insert_probe(gm, request())
        return gm if inner is None else inner(gm, example_inputs)

    return backend


def stream_input_indices(gm: torch.fx.GraphModule) -> list[int]:
    """Indices Dynamo registered for the graph's user objects (its lookup nodes)."""
    return [n.args[0] for n in gm.graph.nodes if n.op == "call_function" and _is_lookup(n.target)]
