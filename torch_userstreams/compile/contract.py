"""The contract of a graph pass: what it needs done before it, what it guarantees after.

A ``GraphPass`` runs on one FX graph with the graph's compile passed in (``run(gm, compile)``,
returning the notes of what it changed). ``run_passes`` checks that every fact a pass
requires was ensured by an earlier one on the same graph, records each pass's result on the
compile, and in debug mode (``TORCH_USERSTREAMS_DEBUG=1``) lints the graph after each pass.
Every pass that changes a graph in place runs this way: on Dynamo's traced graph
(``TracedGraph``, before Dynamo gives it a module), the joint graph (``passes/``) and each
graph the backend compiles (``backends/``). The region split, which builds new graphs
from one, requires the facts it relies on (``require``); the CPU path's stream-free copy
(``regions.without_streams``) relies on none.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch.fx

from ..errors import NotCompilingError, UserStreamsError
from ..fx.meta import drop_leaked_stream_annotation
from .graph_compile import GraphCompile

FACTS = "torch_userstreams.facts"  # gm.meta key: the facts ensured on this graph so far
DEBUG_ENV = "TORCH_USERSTREAMS_DEBUG"


class Fact(enum.Enum):
    """What holds on a graph once a pass ran: the order the passes depend on."""

    PHASES_TAGGED = "phases tagged"  # each node says forward or backward
    WRITE_BACKS_IN_PLACE = "write-backs in place"  # copies into mutated inputs placed
    BACKWARD_STREAMS_INHERITED = "backward streams inherited"
    ACCUMULATIONS_PLACED = "accumulations placed"  # gradient sums on their streams
    BACKWARD_READS_SYNCED = "backward reads synced"  # each cross-stream read has its wait
    SYNCS_COMPLETE = "syncs complete"  # memory reuse synced too: no sync is added after
    # On each forward or backward graph the backend compiles, before its region split:
    REUSE_RESYNCED = "reuse resynced"  # reads Inductor's passes moved are synced again
    FACTORIES_PER_STREAM = "factories per stream"  # no factory is read on two streams


class PassContractError(UserStreamsError):
    """A pass ran before a pass it depends on."""


class Rewritten(Protocol):
    """What a pass rewrites: a graph module, or Dynamo's graph before it has one."""

    @property
    def graph(self) -> torch.fx.Graph: ...

    @property
    def meta(self) -> dict[str, Any]: ...


@dataclass
class TracedGraph:
    """Dynamo's traced graph, which no module owns until the backend is called: what a pass
    on it (``compile.method_syncs``) rewrites, and the facts ensured on it so far."""

    graph: torch.fx.Graph
    meta: dict[str, Any] = field(default_factory=dict)


G = TypeVar("G", bound=Rewritten)


@dataclass(frozen=True)
class GraphPass(Generic[G]):
    name: str
    run: Callable[[G, GraphCompile], list[str]]
    requires: frozenset[Fact] = frozenset()
    ensures: frozenset[Fact] = frozenset()
    # Whether the pass requests objects of the graph's table: only then does it need a
    # compile in progress (AOTAutograd also runs the passes outside torch.compile, e.g. in
    # export's decompositions, where the others still apply).
    needs_compile: bool = False


def facts_of(gm: Rewritten) -> frozenset[Fact]:
    return frozenset(gm.meta.get(FACTS, ()))


def _add_facts(gm: Rewritten, facts: Iterable[Fact]) -> None:
    """Keep ``facts`` in ``gm.meta`` in the order they were ensured (a dict). The graph's meta
    is part of Inductor's FX graph cache key, and a set of enum members pickles in an order
    that varies with each process's hash seed: a warm cache missed in about half the later
    processes."""
    found = gm.meta.setdefault(FACTS, {})
    for fact in sorted(facts, key=lambda fact: fact.value):
        found[fact] = None


def _outside_compile(pass_name: str) -> str:
    leaked = drop_leaked_stream_annotation()
    if leaked is not None:
        return (
            f"torch_userstreams: pass {pass_name} ran outside torch.compile on a graph whose "
            f"nodes carry the stream annotation {{'stream': {leaked!r}}} that an earlier "
            "torch.compile trace left behind when it failed inside a `with stream:` block "
            "(every node traced since got it). The package dropped it now: trace again."
        )
    return (
        f"torch_userstreams: pass {pass_name} ran outside torch.compile on a graph with user "
        "streams; it adds events to the graph's table, which only a compile has. Compile the "
        "function with torch.compile instead."
    )


def run_passes(gm: G, passes: Iterable[GraphPass[G]], compile_: GraphCompile | None) -> None:
    """Run ``passes`` in order on ``gm``, for ``compile_`` (None: outside torch.compile)."""
    debug = os.environ.get(DEBUG_ENV) == "1"
    for graph_pass in passes:
        require(gm, graph_pass.requires, f"pass {graph_pass.name}", compile_)
        if compile_ is None:
            if graph_pass.needs_compile:
                raise NotCompilingError(_outside_compile(graph_pass.name))
            compile_ = GraphCompile()  # records go nowhere: no table is read here
        notes = graph_pass.run(gm, compile_)
        if debug:
            gm.graph.lint()
        _add_facts(gm, graph_pass.ensures)
        compile_.record_pass(graph_pass.name, notes)


def require(
    gm: Rewritten,
    facts: frozenset[Fact],
    by: str,
    compile_: GraphCompile | None,
) -> None:
    """Raise unless every fact in ``facts`` was ensured on ``gm`` (``by`` needs them)."""
    missing = facts - facts_of(gm)
    if missing:
        raise PassContractError(
            f"torch_userstreams: {by} requires {sorted(fact.value for fact in missing)} on "
            f"graph {_name(compile_)}, which no earlier pass ensured. The passes ran out "
            "of order: AOTAutograd's calling sequence changed for this torch."
        )


def _name(compile_: GraphCompile | None) -> str:
    return "<outside torch.compile>" if compile_ is None else compile_.table.graph_name


def ensure(gm: Rewritten, *facts: Fact) -> None:
    """Facts that hold without a pass (a graph with nothing for it to do)."""
    _add_facts(gm, facts)
