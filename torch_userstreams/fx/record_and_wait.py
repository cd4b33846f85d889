"""One place that inserts records and waits into a graph: how a pass orders two streams.

Every sync a pass adds is an event recorded on the stream that did the work and another
stream waiting for it, next to each other (``insert_record_and_wait``) or apart (a record
after a producer, a wait before each of its readers). A wait that ``holds`` a tensor is a
``sync_dealloc``: the tensor's memory stays in use until the wait, so the allocator does
not hand it out while another stream still reads it. Each added node says which pass added
it and why (``fx.meta.record``, read by ``explain()``); ``backward`` (when given) keeps it in
that phase's graph when the joint graph is partitioned.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from .meta import mark_phase, record


def _add(
    graph: torch.fx.Graph,
    at: torch.fx.Node,
    after: bool,
    call: tuple[Any, tuple[Any, ...]],
    by: str,
    why: str,
    backward: bool | None,
) -> tuple[torch.fx.Node, str]:
    with graph.inserting_after(at) if after else graph.inserting_before(at):
        node = graph.call_function(*call)
    if backward is not None:
        mark_phase(node, backward)
    return node, f"{record(node, by, why).note} [{node.name}]"


def _wait(event: int, stream: int, holds: torch.fx.Node | None) -> tuple[Any, tuple[Any, ...]]:
    if holds is None:
        return torch.ops.streams.wait_event.default, (event, stream)
    return torch.ops.streams.sync_dealloc.default, (event, stream, holds)


def insert_record(
    graph: torch.fx.Graph,
    at: torch.fx.Node,
    *,
    after: bool,
    event: int,
    stream: int,
    by: str,
    why: str,
    backward: bool | None = None,
) -> str:
    """``record_event(event, stream)`` just after (or before) ``at``; returns its note."""
    call = (torch.ops.streams.record_event.default, (event, stream))
    return _add(graph, at, after, call, by, why, backward)[1]


def insert_wait(
    graph: torch.fx.Graph,
    at: torch.fx.Node,
    *,
    after: bool,
    event: int,
    stream: int,
    holds: torch.fx.Node | None = None,
    by: str,
    why: str,
    backward: bool | None = None,
) -> str:
    """``stream`` waits for ``event``, just after (or before) ``at``; returns its note."""
    return _add(graph, at, after, _wait(event, stream, holds), by, why, backward)[1]


def insert_record_and_wait(
    graph: torch.fx.Graph,
    at: torch.fx.Node,
    *,
    after: bool,
    event: int,
    recorded_on: int,
    waiting: int,
    holds: torch.fx.Node | None = None,
    by: str,
    why: tuple[str, str],
    backward: bool | None = None,
) -> list[str]:
    """``event`` recorded on ``recorded_on`` just after (or before) ``at``, and ``waiting``'s
    wait for it right after the record; returns the two notes."""
    call = (torch.ops.streams.record_event.default, (event, recorded_on))
    recorded, first = _add(graph, at, after, call, by, why[0], backward)
    _, second = _add(graph, recorded, True, _wait(event, waiting, holds), by, why[1], backward)
    return [first, second]
