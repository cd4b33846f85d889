"""Which of a graph's user objects each call builds: the load plan, decided once.

Every entry of the table says who reads it (``table.Reader``). When the backend has
returned, the plan is made from that, from the indices Dynamo's traced graph reads, and from
the indices the backend's compiled graphs reported reading (``report_reads``, kept on the
compile), and stored on the table. Nothing changes it afterwards: a graph compiled later (a
lazy backward) is checked against it (``check_later_graph``), since the calls only build
what it loads.
"""

from __future__ import annotations

from ..errors import UserObjectError
from .graph_compile import GraphCompile
from .table import EntryKind, HandOver, LoadPlan, Reader, UserObjectTable


def plan_loads(
    table: UserObjectTable,
    traced_reads: set[int],
    reported: set[int] | None,
    *,
    backward_traced: bool,
) -> LoadPlan:
    """The plan for ``table``: ``traced_reads`` are the indices the traced graph and its
    subgraphs read; ``reported`` every index the backend's compiled graphs read, where the
    backend knows them (None: any entry may be read); ``backward_traced`` whether
    AOTAutograd traced the graph's backward while the backend ran."""
    loaded: set[int] = set()
    for entry in table.entries:
        if entry.reader is Reader.CODE:
            loaded.add(entry.index)
        elif entry.index in traced_reads:
            loaded.add(entry.index)
        elif entry.reader is Reader.ADDED_NODES and (reported is None or entry.index in reported):
            loaded.add(entry.index)
    return LoadPlan(frozenset(loaded), _hand_over(table, loaded, reported, backward_traced))


def _hand_over(
    table: UserObjectTable, loaded: set[int], reported: set[int] | None, backward_traced: bool
) -> HandOver:
    """Where the backend reported its graphs' reads, calls hand the backward their binding
    only if a compiled graph, or a backend's (or torch's) own code, reads an object. Where
    they do, AOTAutograd's backward is a Python node on every call; another backend's calls
    are watched for one."""
    reads = (
        reported is None
        or bool(reported)
        or any(
            entry.kind in (EntryKind.REQUESTED, EntryKind.CURRENT_STREAM)
            and entry.reader is Reader.CODE
            and entry.index in loaded
            for entry in table.entries
        )
    )
    if not reads:
        return HandOver.NONE
    return HandOver.EVERY_CALL if backward_traced else HandOver.WHILE_FOUND


def check_later_graph(table: UserObjectTable, reads: set[int], *, backward: bool) -> None:
    """Refuse a graph compiled after the plan was made that reads an object the calls do not
    build (or, for a backward, any object when the calls do not bind the backward)."""
    plan = table.plan
    if plan is None:
        return
    unloaded = sorted(i for i in reads if i not in plan.loaded)
    if unloaded or (backward and reads and not plan.backward_bound):
        missing = ", ".join(map(str, unloaded or sorted(reads)))
        raise UserObjectError(
            f"torch_userstreams: the {'backward' if backward else 'forward'} of graph "
            f"{table.graph_name}, compiled after its prologue, reads user object(s) "
            f"{missing} with its streams and syncs removed (CPU). The prologue was built "
            "for graphs that read none, so the calls do not provide them. Compile this "
            "function with backend='userstreams_aot_eager', and report the graph."
        )


def report_reads(compile_: GraphCompile, reads: set[int], *, backward: bool) -> None:
    """A compiled graph of ``compile_`` reads the table indices ``reads`` at run time: before
    the plan is made, the plan counts them; after, the graph is checked against it."""
    if compile_.table.plan is None:
        compile_.reported_reads = (compile_.reported_reads or set()) | reads
    else:
        check_later_graph(compile_.table, reads, backward=backward)
