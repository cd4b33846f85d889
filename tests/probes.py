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


torch.fx.wrap("probe")


def insert_probe(gm: torch.fx.GraphModule, indices: list[int]) -> None:
    """Insert ``probe(lookup(i) for i in indices)`` right after the inputs."""
    graph = gm.graph
    anchor = [n for n in graph.nodes if n.op == "placeholder"][-1]
    lookups = []
    for index in indices:
        with graph.inserting_after(anchor):
            anchor = graph.call_function(torch_userstreams.lookup, (index,))
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
    return [
        n.args[0] for n in gm.graph.nodes
        if n.op == "call_function" and n.target is torch_userstreams.lookup
    ]
