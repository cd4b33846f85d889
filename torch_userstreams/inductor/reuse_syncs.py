"""Deallocation syncs that still cover their buffers after Inductor's joint-graph passes.

The package's ``dealloc_syncs`` pass runs on AOTAutograd's joint graph. Inductor's own
joint-graph passes run after it and replace a no-op by its operand (``y = x.clone()``,
``x * ones_like(x)``, ``cat([x])``, ``x ** 1``): whatever read ``y`` now reads ``x``, on
another stream than the one the pass synced for ``y``, or later than the sync the pass put
right after the no-op. ``x``'s stream could then reuse its memory while that read runs.

``resync_reuse`` checks each buffer a stream-partitioned graph allocates and frees against
the dealloc syncs now in it and adds the missing ones, before the graph is split into
regions or compiled as one call: right after a stream's last read of the buffer, it
records again the event a dealloc sync of the same buffer (this pass's or the dealloc
pass's) recorded on that stream, and the buffer's own stream waits for it holding the
buffer. The dealloc pass makes one event per sync, and the event is
recorded again only after its last use, each record right before its wait: no pending wait
sees the new record. The event is the graph's own and no later sync uses it, so no
object is added to the table (a backward is compiled after its forward's calls have
loaded theirs).

A buffer no dealloc sync holds at all needs a new event. The partitioner can make such
buffers: the joint graph read a value on another stream and again on its own in the
backward, after a sync that covered the first read, so the pass rightly added nothing;
then the partitioner recomputed the value in the backward instead of saving it, and the
forward frees it right after the other stream's read. While the backend still compiles
the graph, its table takes a new event; a graph compiled later (a lazy backward) is refused
with an error that names the read.

A graph Inductor compiles as one call is lowered whole, and Inductor may compute a read
inside a later kernel, after a record that nothing ties to it: there each record added is
pinned after its read (``PINNED_PASS``), and the check runs again after Inductor's post-grad
passes (``resync_after_post_grad``), which remove no-ops across streams once more.
"""

from __future__ import annotations

import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ..compile import graph_compile
from ..compile.contract import Fact, GraphPass
from ..compile.graph_compile import GraphCompile
from ..compile.table import Reader, UserObjectTable
from ..errors import UnsupportedPathError
from ..fx import control_deps, ops, record_and_wait
from ..fx.control_deps import alias_of, is_passthrough, sync_of
from ..fx.meta import device_of, is_backward_graph
from ..fx.ops import made_by, op_name, operands
from ..fx.record_and_wait import insert_record_and_wait
from ..passes import devices
from ..passes.devices import host_ordered, new_event
from . import regions
from .regions import runs_on

NAME = "reuse_syncs"
_DEALLOC_PASS = "dealloc_syncs"
_EVENT_OPS = ("record_event", "wait_event", "sync_dealloc", "synchronize_event")


@dataclass(frozen=True)
class TableRequests:
    """What the compile of a graph can still add to its table, before its prologue exists:
    a new event for a device, and the device's current stream loaded per call (an entry
    ``table.find_current_stream`` finds is loaded only for graphs that request it)."""

    new_event: Callable[[torch.device], int]
    load_current_stream: Callable[[torch.device], int]


def buffer_of(node: torch.fx.Node) -> torch.fx.Node:
    """The node whose allocation ``node``'s memory is: through passthroughs and views."""
    while True:
        base = made_by(alias_of(node))
        if base is node:
            return node
        node = base


@dataclass
class _Syncs:
    """What a graph's syncs do, by position in it."""

    records: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # event: (at, stream)
    last_use: dict[int, int] = field(default_factory=dict)  # event: position
    deallocs: list[tuple[int, int, int, torch.fx.Node]] = field(default_factory=list)

    def add(self, at: int, name: str, args: tuple[object, ...]) -> None:
        sync = operands(name, args)
        event, stream, held = sync.event, sync.stream, sync.tensor
        if not isinstance(event, int) or name not in _EVENT_OPS:
            return
        self.last_use[event] = at
        if name == "record_event" and isinstance(stream, int):
            self.records.setdefault(event, []).append((at, stream))
        if name == "sync_dealloc" and isinstance(stream, int) and isinstance(held, torch.fx.Node):
            self.deallocs.append((at, event, stream, buffer_of(held)))

    def covers(self, buffer: torch.fx.Node, owner: int, reader: int, after: int) -> bool:
        """Whether ``owner`` waits, holding ``buffer``, for an event ``reader`` records
        after position ``after``."""
        return any(
            held is buffer
            and stream == owner
            and any(after < at < waited and on == reader for at, on in self.records.get(ev, ()))
            for waited, ev, stream, held in self.deallocs
        )

    def event_for(self, buffer: torch.fx.Node, reader: int) -> int | None:
        """An event a dealloc sync of ``buffer`` waited on, recorded on ``reader``.

        The sync may have held the removed no-op for its own stream (Inductor rewrote its
        argument to ``buffer``): only the event is taken, the caller names the owner."""
        for _, ev, _, held in self.deallocs:
            if held is buffer and any(on == reader for _, on in self.records.get(ev, ())):
                return ev
        return None


@dataclass
class _Uses:
    """Where each buffer is made and, per stream, its last reader."""

    made_on: dict[torch.fx.Node, int] = field(default_factory=dict)
    last_read: dict[tuple[torch.fx.Node, int], torch.fx.Node] = field(default_factory=dict)

    def add(self, node: torch.fx.Node, stream: int) -> None:
        if buffer_of(node) is node and isinstance(node.meta.get("val"), torch.Tensor):
            self.made_on[node] = stream
        for used in node.all_input_nodes:
            if alias_of(used) is not None:
                self.last_read[(buffer_of(used), stream)] = node


def _scan(gm: torch.fx.GraphModule, table: UserObjectTable) -> tuple[_Syncs, _Uses]:
    syncs, uses = _Syncs(), _Uses()
    for i, node in enumerate(gm.graph.nodes):
        if node.op != "call_function" or is_passthrough(node):
            continue
        call = sync_of(gm, node)
        if call is not None:
            syncs.add(i, op_name(call.op), call.args)
            continue
        stream = _stream_index(node, table)
        if stream is not None:
            uses.add(node, stream)
    return syncs, uses


def resync_reuse(
    gm: torch.fx.GraphModule,
    table: UserObjectTable,
    requests: TableRequests | None = None,
    *,
    pinned: bool = False,
) -> list[str]:
    """Add the dealloc syncs ``gm`` misses (see the module docstring); returns notes.

    ``requests`` makes an event for the graph's table, where it can still get one (the
    backend is compiling the graph, before its prologue exists): used for a buffer no
    dealloc sync holds at all, such as a value the joint graph kept for its backward that
    the partitioner chose to recompute there instead. ``pinned`` wraps each record it adds
    in a ``control_deps`` on the last read, for a graph Inductor lowers whole: Inductor
    would otherwise compute that read inside its reader's kernel, after the record.
    """
    nodes = list(gm.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    syncs, uses = _scan(gm, table)
    escaped = {buffer_of(n) for n in _outputs(nodes[-1]) if alias_of(n) is not None}
    notes = []
    for (buffer, reader), last in uses.last_read.items():
        owner = uses.made_on.get(buffer)
        if owner is None or owner == reader or buffer in escaped:
            continue
        if host_ordered(device_of(buffer), table.device(owner), table.device(reader)):
            continue  # the dealloc pass rightly made no sync for it
        if syncs.covers(buffer, owner, reader, position[last]):
            continue
        # A read with several outputs is done once the last of its parts is taken (2.12's
        # control_deps realises no tuple: the record pins after each part).
        reads = _parts(last) or [last]
        read_at = max(position[node] for node in reads)
        event = syncs.event_for(buffer, reader)
        if event is not None and table.entries[event].added_by in (_DEALLOC_PASS, NAME):
            after = nodes[max(read_at, syncs.last_use[event])]
        elif requests is not None:
            event, after = requests.new_event(table.device(reader)), nodes[read_at]
        else:
            raise _no_event(table, buffer, last, whole=pinned)
        if requests is not None:
            _load_current_streams(table, requests, reader, owner)
        notes += insert_record_and_wait(
            gm.graph,
            after,
            after=True,
            event=event,
            recorded_on=reader,
            waiting=owner,
            holds=buffer,
            by=NAME,
            why=(
                f"again after the last read of {buffer.name} on stream {reader}",
                f"{buffer.name}'s stream waits before reusing its memory",
            ),
        )
        if pinned:
            _pin_after_reads(gm, after.next, reads)  # the record is right after ``after``
    return notes


def _parts(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The items taken of a node with several outputs (none for a tensor)."""
    if isinstance(node.meta.get("val"), torch.Tensor):
        return []
    return [user for user in node.users if user.target is operator.getitem]


def _pin_after_reads(
    gm: torch.fx.GraphModule, record: torch.fx.Node, reads: list[torch.fx.Node]
) -> None:
    """``record`` wrapped in a ``control_deps`` on ``reads``: Inductor computes each as a
    buffer of its own before the record (torch 2.12+, where the wrapper exists; 2.11's
    Inductor computes every value read after a sync before it while the package is installed,
    ``inductor.placed_streams.wrap_run_node``)."""
    from torch._functorch._aot_autograd import streams

    _wrap_sync_node = getattr(streams, "_wrap_sync_node", None)
    if _wrap_sync_node is None:
        return

    visited: set[torch.fx.Node] = set()
    for node in gm.graph.nodes:
        visited.add(node)
        if node is record:
            break
    _wrap_sync_node(gm, record, reads, visited)


def run(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    """``resync_reuse`` on one graph the backend compiles; while the backend still compiles
    it (its prologue does not exist yet), the graph's table may take new objects."""
    return resync_reuse(gm, compile_.table, _requests(compile_, backward=is_backward_graph(gm)))


def run_pinned(gm: torch.fx.GraphModule, compile_: GraphCompile) -> list[str]:
    """``run`` for a graph Inductor compiles whole: each record it adds is pinned after its
    read (Inductor's post-grad passes would otherwise move the read past it)."""
    requests = _requests(compile_, backward=is_backward_graph(gm))
    return resync_reuse(gm, compile_.table, requests, pinned=True)


def _requests(compile_: GraphCompile, *, backward: bool) -> TableRequests | None:
    if graph_compile.active_or_none() is not compile_:
        return None  # compiled later (a lazy backward): the calls load only what they load

    def make(device: torch.device) -> int:
        return new_event(compile_, device, added_by=NAME, backward=backward)

    def load(device: torch.device) -> int:
        return compile_.current_stream(device, added_by=NAME, read_by=Reader.ADDED_NODES)

    return TableRequests(make, load)


PASS = GraphPass(NAME, run, ensures=frozenset({Fact.REUSE_RESYNCED}))
PINNED_PASS = GraphPass(NAME, run_pinned, ensures=frozenset({Fact.REUSE_RESYNCED}))


def resync_after_post_grad(gm: torch.fx.GraphModule, table: UserObjectTable, user_pass: Any) -> Any:
    """An Inductor ``post_grad_custom_post_pass`` that runs ``user_pass`` (the one the
    compile was configured with, if any), then ``resync_reuse`` on what Inductor's post-grad
    passes left (Inductor's reinplacing and its stable sort run after it: neither moves a
    read across a sync).

    A graph compiled as one call goes through those passes whole, and they remove no-ops
    across streams again (``remove_noop_ops``: a read of ``clone(made)`` on s2 becomes a
    read of ``made``, after the dealloc sync that held ``made`` for the clone). The no-op's
    own dealloc sync names an event for each such read, so no new event is needed: the pass
    asks for none (a hit in Inductor's FX graph cache skips it, and must load the same
    objects), and refuses by name a read that would need one. Its ``uuid`` keys the cache
    by the modules it reads the graph with and ``user_pass``'s own ``uuid`` (the backend
    marks ``control_deps`` cacheable: ``cache_tag.control_deps_cached``). Inductor runs it
    on each subgraph too; only ``gm``'s graph, marked, holds streams (a copy Inductor might
    make keeps the mark). ``check()`` and ``explain()`` see the graph before this pass.
    """
    from torch._inductor import custom_graph_pass
    from torch._inductor.custom_graph_pass import get_hash_for_files

    # 2.12+ tells a pass whether the graph is an inference graph; 2.11 has no such pass.
    aware: Any = getattr(custom_graph_pass, "CustomInferenceAwareGraphPass", None)
    base: Any = aware or custom_graph_pass.CustomGraphPass

    class ResyncAfterInductor(base):  # type: ignore[misc, valid-type]
        def __call__(self, graph: torch.fx.Graph, is_inference: bool = False) -> None:
            for each in _passes(user_pass):
                if aware is not None and isinstance(each, aware):
                    each(graph, is_inference=is_inference)
                else:
                    each(graph)
            module = graph.owning_module
            if not isinstance(module, torch.fx.GraphModule) or not module.meta.get(_MARK):
                return
            if resync_reuse(module, table, pinned=True):
                module.recompile()

        def uuid(self) -> Any:
            users = [getattr(each, "uuid", lambda: None)() for each in _passes(user_pass)]
            if any(uuid is None for uuid in users):
                return None  # a pass Inductor cannot key: no cache, as without us
            return (get_hash_for_files(_READERS).hex(), *users)

    gm.meta[_MARK] = True
    return ResyncAfterInductor()


_MARK = "torch_userstreams.resynced_after_post_grad"
# The modules whose code decides what ``resync_reuse`` adds to a graph.
_READERS = tuple(
    module.__file__ or ""
    for module in (sys.modules[__name__], control_deps, ops, record_and_wait, regions, devices)
)


def _passes(configured: Any) -> tuple[Any, ...]:
    if configured is None:
        return ()
    return tuple(configured) if isinstance(configured, (list, tuple)) else (configured,)


def _stream_index(node: torch.fx.Node, table: UserObjectTable) -> int | None:
    """The table index of the stream ``node`` runs on (its device's current stream's
    entry where it runs on the current stream); None if the table has none."""
    producer = node.args[0] if node.target is operator.getitem else None
    if isinstance(producer, torch.fx.Node) and producer.op == "call_function":
        node = producer  # an item of a tuple is made where the tuple is
    stream = runs_on(node)
    if stream is not None:
        return stream
    entry = table.find_current_stream(device_of(node))
    return None if entry is None else entry.index


def _load_current_streams(table: UserObjectTable, requests: TableRequests, *streams: int) -> None:
    """The syncs about to be inserted name ``streams``: a current stream among them must be
    loaded per call, or the call fails to find it."""
    for stream in streams:
        device = table.device(stream)
        entry = table.find_current_stream(device)
        if entry is not None and entry.index == stream:
            requests.load_current_stream(device)


def _outputs(output: torch.fx.Node) -> list[torch.fx.Node]:
    found: list[torch.fx.Node] = []
    torch.fx.map_arg(output.args, found.append)
    return found


def _no_event(
    table: UserObjectTable, buffer: torch.fx.Node, last: torch.fx.Node, *, whole: bool
) -> UnsupportedPathError:
    if whole:
        return UnsupportedPathError(
            f"torch_userstreams: graph {table.graph_name}: Inductor's post-grad passes moved "
            f"{last} to read {buffer.name} on another stream than the one that allocated it, "
            "and no event of the graph can order the reuse of its memory after that read "
            "(the objects of a compiled call are fixed before Inductor's passes run). "
            "Compile this function as regions: options={'userstreams.one_call': False}."
        )
    return UnsupportedPathError(
        f"torch_userstreams: graph {table.graph_name}: after Inductor's graph passes, "
        f"{last.name} reads {buffer.name} on another stream than the one that allocated it, "
        "and no event of the graph can order the reuse of its memory after that read (the "
        "graph is compiled after its objects were made: a backward AOTAutograd compiles "
        "lazily, at its first run). Compile this function with "
        "backend='userstreams_aot_eager', or set "
        "torch._functorch.config.force_non_lazy_backward_lowering = True so that the "
        "backward compiles with its forward."
    )
