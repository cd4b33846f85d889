"""A post-grad graph read as stream work: regions that each run on one stream, and syncs.

``split(gm)`` turns a forward or backward graph into steps, in an order the host can issue:

* a ``SyncCall`` for each sync op (plain, or wrapped in ``control_deps``); syncs are
  boundaries, nothing moves across one (but see the records held back, ``_Grouping``);
* ``Region``s of compute nodes that share a stream (``runs_on``; unannotated nodes and the
  current-stream entries are one stream). Between two syncs, a node joins the latest region
  of its stream when everything it reads is made by then; otherwise it opens a new region
  after the others. So ``a@side, b@main, c@side`` (``c`` not reading ``b``) becomes two
  regions, not three, and the host launches them in an order that respects every data
  dependency. Nodes that mutate or have other side effects never move earlier than what
  precedes them: they join only the last step, if it is a region of theirs, else open one;
  a ``getitem`` stays with the node whose tuple it reads.

``region_module(gm, region)`` builds the region's own graph: its inputs are the values made
outside it, its outputs the values read outside it (a sync that only orders itself after a
value does not read it).

A ``control_deps`` wrapper (``fx.control_deps``) only exists to stop a compiler from moving
work across its sync, which splitting already guarantees: it is read as the sync it issues,
and its passthroughs as the values they pass through.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ..compile.contract import Fact, GraphPass
from ..fx.control_deps import SyncCall, alias_of, is_control_deps, is_passthrough, sync_of
from ..fx.meta import RECORDS, drop_stream, record, records, set_stream, stream_of
from ..fx.ops import is_sync_op, op_name
from ..fx.subgraphs import attribute, called_by, reachable


@dataclass(eq=False)
class Region:
    """Compute nodes that run on ``stream`` (None: the current stream), in graph order."""

    stream: int | None
    nodes: list[torch.fx.Node] = field(default_factory=list)


def has_side_effects(region: Region) -> bool:
    """Whether ``region`` writes something (an input's write-back ``copy_``, a buffer
    update) even when nothing it makes is read outside it."""
    return any(_pinned(node) for node in region.nodes)


# Dtypes eager ATen may have no kernel for where Inductor generates code (fake tensors
# do not check): a region holding one goes to Inductor.
_INDUCTOR_ONLY_DTYPES = {
    getattr(torch, name)
    for name in (
        "uint16",
        "uint32",
        "uint64",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
    )
    if hasattr(torch, name)
}
# Runtime checks Inductor drops (it proved them while compiling) but eager performs.
_CHECKS = ("_assert", "sym_constrain_range")


def kernels_launched(gm: torch.fx.GraphModule) -> int | None:
    """How many kernels a region's graph launches when run as it is, or None where it must
    go to Inductor: every op an ATen op that neither writes, draws random numbers nor checks
    at run time, on dtypes eager ATen computes; views launch none.

    Anything else (a subgraph call, a size expression) goes to Inductor, and so does every
    region under max-autotune, which may pick a faster kernel than eager's.
    """
    from torch._inductor import config

    if config.max_autotune or config.max_autotune_gemm or config.max_autotune_pointwise:
        return None
    kernels = 0
    for node in gm.graph.nodes:
        value = node.meta.get("val")
        if isinstance(value, torch.Tensor) and value.dtype in _INDUCTOR_ONLY_DTYPES:
            return None
        if node.op in ("placeholder", "output", "get_attr") or node.target is operator.getitem:
            continue
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            return None
        if target.namespace != "aten" or target._schema.is_mutable:
            return None
        if torch.Tag.nondeterministic_seeded in target.tags:
            return None
        if target.__name__.startswith(_CHECKS):
            return None
        kernels += not target.is_view
    return kernels


def at_most_one_kernel(gm: torch.fx.GraphModule) -> bool:
    """Whether a region's graph launches at most one kernel (``kernels_launched``).

    Inductor has nothing to fuse in such a region, and compiling it costs Inductor's fixed
    cost per graph (tens of milliseconds on CUDA): the package runs its graph as it is.
    """
    kernels = kernels_launched(gm)
    return kernels is not None and kernels <= 1


def _pinned(node: torch.fx.Node) -> bool:
    """Nodes that must not move earlier: mutations and other side effects."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable:
        return True
    return node.is_impure()


def runs_on(node: torch.fx.Node) -> int | None:
    """The stream ``node``'s region runs on: its annotation's. A node without one that reads
    nothing (a factory) runs on its users' stream when they all share one. Inductor adds such
    nodes after the package's passes (the seeds its random ops read: ``inductor_seeds``);
    made on the current stream, they would be read on the users' stream with no sync."""
    stream = stream_of(node)
    if stream is not None or node.all_input_nodes or not node.users:
        return stream
    streams = _users_by_stream(node)
    return next(iter(streams)) if len(streams) == 1 else None


def factories_on_their_readers_stream(gm: torch.fx.GraphModule) -> None:
    """Annotate each node that ``runs_on`` a stream it is not annotated with: for a graph
    Inductor compiles whole, where the annotation alone places a node (the seeds of random
    ops on a side stream were made on the current stream, and read with no sync)."""
    for node in gm.graph.nodes:
        stream = runs_on(node) if node.op == "call_function" else None
        if stream is not None and stream_of(node) is None:
            set_stream(node, stream)


def _users_by_stream(node: torch.fx.Node) -> dict[int | None, list[torch.fx.Node]]:
    by_stream: dict[int | None, list[torch.fx.Node]] = {}
    for user in node.users:
        stream = stream_of(user) if user.op == "call_function" else None
        by_stream.setdefault(stream, []).append(user)
    return by_stream


_TORCH_NAMESPACES = frozenset({"aten", "prims"})


def _is_seeds(target: object) -> bool:
    """Whether ``target`` is the seeds tensor Inductor makes for a graph's random ops."""
    return isinstance(target, torch._ops.OpOverload) and target.name() == "prims::inductor_seeds"


def _copyable(target: object) -> bool:
    """Whether a copy of the factory computes the same value: a deterministic op of torch's
    own, or the seeds Inductor makes for its random ops (each copy seeds its own stream's
    random ops: no value is then read by two streams). A random factory of the user's
    (``randperm``, ``rand`` under ``fallback_random``) is one value, whoever reads it, and
    a user's op may count, log or draw whatever its schema says: it runs once."""
    if not isinstance(target, torch._ops.OpOverload) or target._schema.is_mutable:
        return False
    if _is_seeds(target):
        return True
    if target.namespace not in _TORCH_NAMESPACES:
        return False
    return torch.Tag.nondeterministic_seeded not in target.tags


COPY_FACTORIES = "factories_per_stream"


def copy_factories_per_stream(gm: torch.fx.GraphModule) -> list[str]:
    """Give an unannotated factory read on several streams a copy per stream, each then run
    on its readers' stream (``runs_on``): Inductor makes one seeds tensor for every random
    op of a graph, and random ops on two streams would read it with no sync. Inductor 2.14+
    gives that seeds tensor the first random op's meta, stream included: its annotation is
    dropped, so that it too runs on its readers' stream. Returns a note per copy (each also
    recorded on the copy)."""
    notes = []
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.all_input_nodes:
            continue
        if stream_of(node) is not None and _is_seeds(node.target):
            drop_stream(node)
        if stream_of(node) is not None:
            continue
        if is_sync_op(node.target) or not _copyable(node.target):
            continue
        for stream, users in list(_users_by_stream(node).items())[1:]:
            with gm.graph.inserting_after(node):
                copy = gm.graph.node_copy(node)
            copy.meta[RECORDS] = records(node)  # its own list: node_copy shares the meta's
            for user in users:
                user.replace_input_with(node, copy)
            on = "no stream block" if stream is None else f"stream {stream}"
            why = f"a copy of {node.name} for its readers on {on}"
            notes.append(f"{record(copy, COPY_FACTORIES, why).note} [{copy.name}]")
    if notes:
        gm.recompile()
    return notes


FACTORIES_PASS: GraphPass[torch.fx.GraphModule] = GraphPass(
    COPY_FACTORIES,
    lambda gm, compile_: copy_factories_per_stream(gm),
    ensures=frozenset({Fact.FACTORIES_PER_STREAM}),
)

Step = Region | SyncCall


# The syncs that read an event, and the position of the event among their arguments.
_EVENT_READERS = {"record_event": 0, "wait_event": 0, "sync_dealloc": 0, "synchronize_event": 0}


def _event_of(step: SyncCall) -> int | None:
    position = _EVENT_READERS.get(op_name(step.op))
    return None if position is None else step.args[position]


class _Grouping:
    """The graph's steps as they are built: regions, and the syncs between them.

    A sync closes every open region: work after it in the graph is launched after it. (A
    wait orders only its own stream, but a stream the user passes in may be the current
    stream, or another one passed in, at run time: which regions it orders is not known.)
    The current-stream entries (``current``) and the unannotated nodes' stream (None) are
    one stream: the passes place their syncs on that assumption.

    A ``record_event`` of an event only the package's passes made (``holdable``: no user
    sees it, so no timing, query or synchronize reads it, and each index is an object of its
    own) is held back until the next sync that reads that event (a wait, a dealloc wait,
    another record of it) or the end of the graph, and is no boundary meanwhile: work of its
    stream after it may join the region before it. The event then marks a later point of its
    stream than the graph's order says, so whoever waits for it waits for that work too:
    ordering is only added, never removed, and the record is still issued before every wait
    for it. So a record between two pieces of a stream's work (a backward's gradient ready
    for the join, a dealloc sync's record) does not split that work into two compiled
    regions.
    """

    def __init__(self, holdable: Callable[[Any], bool], current: frozenset[int]) -> None:
        self.steps: list[Step] = []
        self.region_of: dict[torch.fx.Node, Region] = {}
        self.position: dict[Region, int] = {}  # each region's index in ``steps``
        self.open: list[Region] = []  # regions that may take more nodes, in launch order
        self.frozen = 0  # regions before this step index take no more nodes
        self.holdable = holdable
        self.current = current
        self.held: list[SyncCall] = []  # records not yet issued, in graph order

    def stream(self, index: Any) -> Any:
        """The stream ``index`` names, with the current stream as None."""
        return None if index in self.current else index

    def sync(self, step: SyncCall) -> None:
        event = _event_of(step)
        if event is not None and op_name(step.op) == "record_event" and self.holdable(event):
            self.held.append(step)
            return
        if event is not None:
            self._release(event)
        self._issue(step)

    def finish(self) -> list[Step]:
        """The steps, with every record still held issued at the end of the graph."""
        for held in self.held:
            self._issue(held)
        self.held.clear()
        return self.steps

    def _release(self, event: Any) -> None:
        still_held = []
        for held in self.held:
            if _event_of(held) == event:
                self._issue(held)
            else:
                still_held.append(held)
        self.held = still_held

    def _issue(self, step: SyncCall) -> None:
        self.steps.append(step)
        self.open = []

    def place(self, node: torch.fx.Node) -> None:
        producer = node.args[0] if node.target is operator.getitem else None
        if isinstance(producer, torch.fx.Node) and producer in self.region_of:
            self._join(self.region_of[producer], node)  # a getitem stays with its tuple
            return
        stream = self.stream(runs_on(node))
        target = self._last(stream) if _pinned(node) else self._latest_ready(node, stream)
        if target is None:
            target = Region(stream)
            self.position[target] = len(self.steps)
            self.steps.append(target)
            self.open.append(target)
        self._join(target, node)
        if _pinned(node):
            self.frozen = self.position[target]

    def _join(self, region: Region, node: torch.fx.Node) -> None:
        region.nodes.append(node)
        self.region_of[node] = region

    def _last(self, stream: int | None) -> Region | None:
        """The last step, if it is an open region on ``stream``: a pinned node may join it,
        since nothing launched after it would then run before the node. (A runtime check
        such as ``_assert_scalar`` then stays with the size it checks.) The last region is
        never frozen: a pinned node freezes only the regions before its own."""
        last = self.steps[-1] if self.steps else None
        if isinstance(last, Region) and last in self.open and last.stream == stream:
            return last
        return None

    def _latest_ready(self, node: torch.fx.Node, stream: int | None) -> Region | None:
        """The latest open region of ``stream`` that may run ``node``: every value ``node``
        reads is made by it or by a region launched before it."""
        candidates = [
            region
            for region in self.open
            if region.stream == stream and self.position[region] >= self.frozen
        ]
        if not candidates:
            return None
        latest = self.position[candidates[-1]]
        for used in node.all_input_nodes:
            region = self.region_of.get(alias_of(used))
            if region is not None and self.position[region] > latest:
                return None
        return candidates[-1]


def split(
    gm: torch.fx.GraphModule,
    holdable: Callable[[Any], bool] = lambda event: False,
    current: frozenset[int] = frozenset(),
) -> list[Step]:
    """The graph as regions and syncs, in issue order (see the module docstring); the
    records of events ``holdable`` says only the package reads are held back, and the
    stream indices in ``current`` are the current stream, the one unannotated nodes run on
    (``_Grouping``)."""
    grouping = _Grouping(holdable, current)
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr") or is_passthrough(node):
            continue
        step = sync_of(gm, node)
        if step is not None:
            grouping.sync(step)
        else:
            grouping.place(node)
    return grouping.finish()


def _size_symbols(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """The graph's symbolic-size inputs. Every region takes them: Inductor finds a size
    symbol from an input's shape only where it stands alone, and a region's input may have
    the shape ``(s0*s1,)``."""
    return [
        node
        for node in gm.graph.find_nodes(op="placeholder")
        if isinstance(node.meta.get("val"), torch.SymInt)
    ]


def _sym_sizes(value: Any) -> list[torch.SymInt]:
    """The symbolic sizes of a value: a tensor's sizes, strides and offset, or itself."""
    if isinstance(value, torch.SymInt):
        return [value]
    if not isinstance(value, torch.Tensor):
        return []
    sizes = (*value.shape, *value.stride(), value.storage_offset())
    return [size for size in sizes if isinstance(size, torch.SymInt)]


def _size_binders(gm: torch.fx.GraphModule, inputs: list[torch.fx.Node]) -> list[torch.fx.Node]:
    """Graph inputs that bind size symbols a region's ``inputs`` need but do not bind.

    Inductor binds a symbol from a tensor input's size where it stands alone (not from
    ``2*s17``), and from a symbolic-size input as the symbol it was made as: once a guard
    unified two sizes the shape env writes ``s77`` as ``s17``, and a region given ``s77``
    and a tensor of size ``2*s17`` could not be compiled. A graph input of size ``s17``
    binds it, as it does natively."""
    needed: set[Any] = set()
    bound: set[Any] = set()
    # ``expr`` is a size as the shape env writes it now (replacements applied), what the
    # region's code will compute from; ``_expr`` is a symbolic-size input as it was made,
    # the one symbol Inductor binds from it. A binder is a tensor passed for its sizes
    # alone: it is not a read of its data, and it lives until the region runs.
    for node in inputs:
        value = node.meta.get("val")
        for size in _sym_sizes(value):
            needed |= size.node.expr.free_symbols
            if size.node.expr.is_Symbol and not isinstance(value, torch.SymInt):
                bound.add(size.node.expr)
        if isinstance(value, torch.SymInt) and value.node._expr.is_Symbol:
            bound.add(value.node._expr)
    missing = needed - bound
    binders = []
    for node in gm.graph.find_nodes(op="placeholder"):
        if not missing:
            break
        binds = {size.node.expr for size in _sym_sizes(node.meta.get("val"))} & missing
        if binds and not isinstance(node.meta.get("val"), torch.SymInt):
            binders.append(node)
            missing -= binds
    return binders


def _values_read(nodes: list[torch.fx.Node]) -> Iterator[torch.fx.Node]:
    for node in nodes:
        yield from node.all_input_nodes


@dataclass
class RegionModule:
    """A region as a graph of its own: ``inputs`` and ``outputs`` are outer-graph nodes."""

    gm: torch.fx.GraphModule
    inputs: list[torch.fx.Node]
    outputs: list[torch.fx.Node]


def region_module(gm: torch.fx.GraphModule, region: Region) -> RegionModule:
    """Build ``region``'s graph (see the module docstring). The subgraphs it calls (a
    ``torch.cond`` branch, say) lose their stream annotations: a region runs on one stream."""
    members = set(region.nodes)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.fx.Node] = []

    def take(value: torch.fx.Node) -> None:
        placeholder = graph.placeholder(value.name)
        placeholder.meta = dict(value.meta)
        # The node that made it binds its data-dependent sizes (``x[x > 0]``); here it is
        # an input, whose sizes Inductor reads from the tensor.
        placeholder.meta.pop("unbacked_bindings", None)
        env[value] = placeholder
        inputs.append(value)

    for used in (*_size_symbols(gm), *_values_read(region.nodes)):
        value = alias_of(used)
        if value in members or used in env:
            continue
        if value.op == "get_attr":
            env[used] = graph.get_attr(str(value.target))
            env[used].meta = dict(value.meta)
            continue
        if value not in env:
            take(value)
        env[used] = env[value]
    for binder in _size_binders(gm, inputs):
        if binder not in env:
            take(binder)

    def copied(value: torch.fx.Node) -> torch.fx.Node:
        # a passthrough of a value the region makes itself (a record held back: ``split``)
        return env[value] if value in env else env[alias_of(value)]

    for node in region.nodes:
        env[node] = drop_stream(graph.node_copy(node, copied))
    outputs = [n for n in region.nodes if _read_outside(n, members)]
    graph.output(tuple(env[n] for n in outputs))
    module = torch.fx.GraphModule(attributes(gm, graph, keep_syncs=True), graph)
    return RegionModule(module, inputs, outputs)


def _read_outside(node: torch.fx.Node, members: set[torch.fx.Node]) -> bool:
    """Whether a node outside ``members`` reads ``node``'s value, directly or through a
    passthrough. A ``control_deps`` that only lists ``node`` among what its sync follows
    reads nothing: the region is issued before the sync anyway. Returning such values made
    Inductor keep a buffer for each, and rewrite a region's scatter chain into a form its
    reinplace pass fails on with symbolic sizes."""
    for user in node.users:
        if user in members:
            continue
        if not is_control_deps(user):
            return True
        passthroughs = (p for p in user.users if _passes_on(p, node))
        if any(_read_outside(p, members) for p in passthroughs):
            return True
    return False


def _passes_on(reader: torch.fx.Node, operand: torch.fx.Node) -> bool:
    """Whether ``reader`` (a user of a ``control_deps``) is the passthrough of ``operand``
    itself: one step, not a chain."""
    if reader.target is not operator.getitem:
        return False
    owner, index = reader.args[0], reader.args[1]
    return (
        isinstance(index, int)
        and index > 0
        and isinstance(owner, torch.fx.Node)
        and owner.args[1 + index] is operand
    )


def syncs_in_subgraphs(
    gm: torch.fx.GraphModule, nodes: Iterable[torch.fx.Node]
) -> Iterator[tuple[torch.fx.Node, str]]:
    """(calling node, sync op) for each sync inside a subgraph one of ``nodes`` calls (a
    ``torch.cond`` branch, a ``nested_compile_region`` body), nested ones included."""
    for node in nodes:
        for called in called_by(gm, node):
            for sub in reachable(called):
                for inner in sub.module.graph.nodes:
                    step = sync_of(sub.module, inner)
                    if step is not None:
                        yield node, getattr(step.op, "__name__", str(step.op))


def has_stream_work(gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` (or a subgraph it calls) has a stream annotation or a sync."""
    return any(
        stream_of(node) is not None or sync_of(sub.module, node) is not None
        for sub in reachable(gm)
        for node in sub.module.graph.nodes
    )


def without_streams(
    gm: torch.fx.GraphModule, *, keep_syncs: bool = False, keep_streams: bool = False
) -> torch.fx.GraphModule:
    """A copy of ``gm`` (and of the subgraphs it calls) with no stream annotation (unless
    ``keep_streams``: ``gm``'s own nodes keep theirs; a subgraph runs on its caller's
    stream), and, unless ``keep_syncs``, no sync: a ``control_deps`` passthrough becomes its
    operand."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    for node in gm.graph.nodes:
        if not keep_syncs and alias_of(node) is not node:
            value = alias_of(node)
            env[node] = None if value is None else env[value]
            continue
        if not keep_syncs and sync_of(gm, node) is not None:
            continue
        copy = graph.node_copy(node, lambda n: env[n])
        env[node] = copy if keep_streams else drop_stream(copy)
    graph.eliminate_dead_code()
    return torch.fx.GraphModule(attributes(gm, graph, keep_syncs=keep_syncs), graph)


def attributes(
    gm: torch.fx.GraphModule, graph: torch.fx.Graph, *, keep_syncs: bool
) -> dict[str, Any]:
    """The attributes ``graph``'s get_attr nodes read from ``gm``; subgraphs without streams."""
    found: dict[str, Any] = {}
    for node in graph.nodes:
        if node.op == "get_attr":
            value = attribute(gm, node, required=True)
            if isinstance(value, torch.fx.GraphModule):
                value = without_streams(value, keep_syncs=keep_syncs)
            found[str(node.target)] = value
    return found


def without_syncs(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of ``gm`` without its syncs, each of its nodes still on its stream (the
    subgraphs it calls run on their caller's): what a CPU graph, whose program order meets
    every sync, compiles as one call."""
    return without_streams(gm, keep_streams=True)
