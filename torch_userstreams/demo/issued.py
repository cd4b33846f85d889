"""What the compiled program of one graph issues, in order: what the timeline draws.

The backends issue different syncs for the same graph:

* ``userstreams_aot_eager`` runs every node in graph order on its stream and issues every
  sync (``backends.executor``);
* ``userstreams`` compiles a graph whose objects are all CPU ones without its syncs (a CPU
  stream runs everything in program order): none is issued;
* ``userstreams`` on an accelerator splits the graph into per-stream regions, holding back
  the records of package-made events (``regions.split``), and leaves out the waits
  ``redundant_syncs`` finds redundant, with their records.

The steps are read through the backend's own functions, not worked out again here, so
that the drawing cannot show a wait the program does not issue as one that ran.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch.fx

from ..backends.inductor_graphs import split_and_issued
from ..compile.table import UserObjectTable, all_on_cpu
from ..fx.control_deps import SyncCall, sync_of
from ..fx.meta import stream_of
from ..fx.ops import is_lookup
from ..inductor.regions import Region, has_stream_work

AOT_EAGER = "userstreams_aot_eager"


@dataclass(frozen=True)
class Issued:
    """An op on ``stream`` (None: the current stream), or a sync; ``issued`` is False for
    a sync the backend leaves out."""

    node: torch.fx.Node
    stream: int | None = None
    sync: SyncCall | None = None
    issued: bool = True


def issues_work(node: torch.fx.Node) -> bool:
    """False for what runs on the host only: getitem, the package's lookups, non-calls."""
    return (
        node.op == "call_function"
        and node.target is not operator.getitem
        and not is_lookup(node.target)
    )


def issued_steps(
    gm: torch.fx.GraphModule, table: UserObjectTable | None, backend: str
) -> list[Issued]:
    """``gm``'s ops and syncs in the order ``backend`` issues them (module docstring)."""
    if backend == AOT_EAGER or not has_stream_work(gm):
        return _graph_order(gm, issued=True)
    if all_on_cpu(table):
        return _graph_order(gm, issued=False)
    return _regions(gm, table)


def _graph_order(gm: torch.fx.GraphModule, *, issued: bool) -> list[Issued]:
    steps = []
    for node in filter(issues_work, gm.graph.nodes):
        sync = sync_of(gm, node)
        if sync is None:
            steps.append(Issued(node, stream_of(node)))
        else:
            steps.append(Issued(node, sync=sync, issued=issued))
    return steps


def _regions(gm: torch.fx.GraphModule, table: UserObjectTable | None) -> list[Issued]:
    steps, runs = split_and_issued(gm, table)
    kept = {id(step) for step in runs}
    issued: list[Issued] = []
    for step in steps:
        if isinstance(step, Region):
            issued.extend(Issued(n, step.stream) for n in step.nodes if issues_work(n))
        elif step.node is not None:  # (split reads every sync from the graph)
            issued.append(Issued(step.node, sync=step, issued=id(step) in kept))
    return issued


def syncs_caption(backend: str, table: UserObjectTable | None, left_out: int) -> str:
    """One line: whether the syncs drawn ran."""
    if backend == AOT_EAGER:
        cpu = " (CPU streams: they order nothing, every op runs in program order)"
        return (
            "syncs: every sync drawn is issued: backend 'userstreams_aot_eager' runs each "
            "node on its stream and issues each sync in graph order"
            + (cpu if all_on_cpu(table) else "")
        )
    if all_on_cpu(table) and left_out:
        return (
            "syncs: none ran. On CPU, backend 'userstreams' compiles each graph without its "
            "syncs (a CPU stream runs everything in program order); the hollow "
            "markers show where the code's syncs were"
        )
    if not left_out:
        return "syncs: every sync drawn is issued by backend 'userstreams'"
    return (
        f"syncs: solid markers are issued; the {left_out} hollow ones never run: backend "
        "'userstreams' leaves out a wait whose stream is already ordered after the record, "
        "and a record no wait reads then"
    )
