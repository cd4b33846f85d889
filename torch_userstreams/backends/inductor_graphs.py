"""The ``userstreams`` backend's compiler for each forward and backward graph.

AOTAutograd's graphs (after the package's passes and the partitioner) reach it with each
node's stream annotated and every sync in place. It compiles:

* a graph with no stream annotation and no sync: as is;
* by default: as **one compiled call** (``whole``), on an accelerator and on CPU alike.
  Inductor 2.12+ places each node on its stream (on 2.11 the package does,
  ``inductor.placed_streams``); while the package is installed its scheduler keeps every sync
  where the graph put it (``inductor.sync_order``) and its code resolves the call's
  objects once and issues each sync as their method (``inductor.launch_code``). A graph
  whose streams and events are all CPU objects goes without its syncs: a CPU stream runs
  nothing asynchronously, every op runs in program order on the host, so every sync is
  already satisfied when it would be issued (and native CPU events cannot record). A
  graph that would meet one of Inductor's own failures stays regions (``stays_regions``);
* otherwise, a CPU graph: as one graph without its streams and syncs (exact, as above);
* otherwise (asked with ``options={"userstreams.one_call": False}``, or a graph Inductor
  fails on whole): split into regions of one stream each
  (``regions.split``); each region is compiled by Inductor on its own, except one of a
  single kernel, which runs as its graph (``regions.at_most_one_kernel``); at run time the
  host enters each region's stream (resolved from the call's binding; a region of views
  alone launches nothing and enters none), launches it (after the first call, through the
  ``call`` Inductor generated), and issues the syncs between regions in graph order
  (``plan``). A region compiled by Inductor is plain stream-free code, so Inductor's caches
  serve it like any other graph.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.fx

from ..compile.contract import Fact, ensure, require, run_passes
from ..compile.graph_compile import GraphCompile
from ..compile.load_plan import report_reads
from ..compile.prologue import referenced_indices
from ..compile.table import UserObjectTable, all_on_cpu
from ..errors import UnsupportedPathError
from ..fx.control_deps import SyncCall, alias_of
from ..fx.meta import is_backward_graph, mark_graph_phase
from ..fx.subgraphs import held_by
from ..inductor import reuse_syncs
from ..inductor.after_waits import computed_after_waits
from ..inductor.early_values import computed_early
from ..inductor.launch_code import LOOKUP, objects_resolved
from ..inductor.placed_streams import PLACED
from ..inductor.redundant_syncs import (
    judged,
    judgement,
    made_by_the_package,
    may_name_one,
    the_current_stream,
    without_redundant_waits,
)
from ..inductor.regions import (
    FACTORIES_PASS,
    Region,
    at_most_one_kernel,
    factories_on_their_readers_stream,
    has_side_effects,
    has_stream_work,
    kernels_launched,
    region_module,
    split,
    syncs_in_subgraphs,
    without_streams,
    without_syncs,
)
from ..inductor.sync_lines import JUDGEMENT
from ..observe import part_of_a_program
from ..passes import sync_inference_graph_in_backend
from ..run.issue_syncs import issuer
from ..run.plan import Program, Ref, Step
from .cache_tag import control_deps_cached, keyed_by_streams, tagged
from .check_on_compile import check_graph
from .donations import keyed_by_donations, true_donations
from .subgraph_streams import construct_names

log = logging.getLogger("torch_userstreams")

Compiler = Callable[..., Any]
GraphHook = Callable[[torch.fx.GraphModule, dict[str, Any]], None]


# Inductor keys a buffer's reuse by the stream of its last rename, and the ordering it gives
# a sync's passed-through values renames them (2.13: a ``wait_stream``'s; 2.14+: any sync's):
# a buffer made and read on the current stream took a side stream's key, and a side-stream
# kernel reused its memory while the current stream could still read it (2.13, found by the
# race detector on a generated program). A graph compiled as one call reuses no buffer, on
# every release (memory for correctness; 2.12 renames nothing, untested without it), except
# on CPU, where every kernel runs on the host in program order.
# Memory planning (inference graphs) pools buffers by their lifetimes in program order,
# whatever their streams.
NO_BUFFER_REUSE = {"allow_buffer_reuse": False, "inplace_buffers": False, "memory_planning": False}

# A graph the package places on its streams (torch 2.11, ``inductor.placed_streams``): Inductor's
# post-grad pass that moves each value down to its first reader moves work past the syncs
# after it where nothing ties the two (``control_deps`` does, on 2.12+): a side stream's
# ``x * x`` went below the wait that orders another stream after it. Combo kernels group
# nodes by device alone, into one kernel on one stream.
PLACED_CONFIG = {"reorder_for_locality": False, "combo_kernels": False}

# What each graph with stream work has had done before its region split, by the passes that
# run on every such graph the backend compiles (``reuse_syncs.PASS``, then
# ``regions.FACTORIES_PASS``).
SPLIT_REQUIRES = frozenset({Fact.REUSE_RESYNCED, Fact.FACTORIES_PER_STREAM})


class InductorGraphCompiler:
    """An ``inner_compile`` for ``compile_fx``: see the module docstring.

    The compile is the graph's, passed in when its backend ran (a backward may be compiled
    later, outside that compile).
    """

    def __init__(
        self,
        compile_: GraphCompile | None,
        compile_region: Compiler,
        on_graph: GraphHook | None = None,
        one_call: bool = False,
    ) -> None:
        self.compile_ = compile_
        self.one_call = one_call
        self.table = None if compile_ is None else compile_.table
        self.compile_region = compile_region
        self.on_graph = on_graph
        self.cpu = all_on_cpu(self.table)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        if kwargs.get("is_inference"):
            sync_inference_graph_in_backend(gm)
        streams = has_stream_work(gm)
        whole = streams and self.one_call and not stays_regions(gm)
        # The package writes a CPU graph's stream blocks, and 2.11's, into Python wrapper
        # code only (2.12+ Inductor writes its own into C++ wrapper code on a GPU).
        whole = whole and not (_not_python_wrapper() and (self.cpu or not inductor_runs_streams()))
        stripped = streams and self.cpu and not whole
        if streams and not stripped:
            mark_graph_phase(gm, backward=bool(kwargs.get("is_backward")))
            if self.compile_ is None or self.cpu:
                ensure(gm, Fact.REUSE_RESYNCED)  # no table, or CPU: no event orders anything
            else:
                resync = reuse_syncs.PINNED_PASS if whole else reuse_syncs.PASS
                run_passes(gm, (resync,), self.compile_)
        if self.on_graph is not None:
            self.on_graph(gm, kwargs)
        check_graph(gm, self.table, "backward" if kwargs.get("is_backward") else "forward")
        if not streams:
            self._note_reads(gm, kwargs)
            # Its forward may have had stream work, and its donations been amended.
            with keyed_by_donations() if kwargs.get("is_backward") else contextlib.nullcontext():
                return self.compile_region(gm, example_inputs, **kwargs)
        # Passthroughs run as their operands in both paths below: what AOTAutograd counted
        # as separate saved tensors may now be one tensor, or an input (``donations``).
        with true_donations(gm, kwargs, regions=not stripped):
            if stripped:
                stripped_gm = without_streams(gm)
                self._note_reads(stripped_gm, kwargs)
                return self.compile_region(stripped_gm, example_inputs, **kwargs)
            if whole and self.cpu:
                # Every op of a CPU graph runs on the host in program order: each sync is
                # met before it would be issued (native CPU events cannot even record). Its
                # streams stay, for Inductor to place each node on as on an accelerator.
                gm = without_syncs(gm)
                self._note_reads(gm, kwargs)
            if whole:
                return self.whole(gm, example_inputs, kwargs)
            return self.partitioned(gm, kwargs)

    def _note_reads(
        self, gm: torch.fx.GraphModule, kwargs: dict[str, Any], compiled: Any = None
    ) -> None:
        """Every graph of the compile is compiled here, so the compile learns all that its
        compiled code reads: the load plan then builds no event for syncs that were removed
        (on CPU, every sync; in one compiled call, the waits its order leaves out). What
        ``compiled``'s code resolves is read off its source where the package wrote its
        lookup there (``inductor_streams.objects_resolved``); otherwise every index the
        graph names counts."""
        if self.compile_ is None:
            return
        source = getattr(compiled, "source_code", None)
        reads = None
        if isinstance(source, str) and LOOKUP in source:
            reads = objects_resolved(source)
        if reads is None:
            reads = set().union(*(referenced_indices(m.graph) for m in held_by(gm)))
        report_reads(self.compile_, reads, backward=bool(kwargs.get("is_backward")))

    def whole(self, gm: torch.fx.GraphModule, example_inputs: Any, kwargs: dict[str, Any]) -> Any:
        """The graph as one compiled call, its streams and syncs Inductor's to issue."""
        import torch._inductor.config as inductor_config

        if getattr(kwargs.get("cudagraphs"), "value", False) and not self.cpu:
            # (Inductor captures no CPU graph: nothing to skip, nor to log.)
            backward = bool(kwargs.get("is_backward"))
            _skip_cudagraphs(gm, self.table, backward=backward, one_call=True)
        _refuse_syncs_in_subgraphs(gm, gm.graph.nodes, self.table)
        run_passes(gm, (FACTORIES_PASS,), self.compile_)
        factories_on_their_readers_stream(gm)
        if not self.cpu:
            backward = bool(kwargs.get("is_backward"))  # for its code (``inductor.sync_lines``)
            gm.meta[JUDGEMENT] = judgement(self.table, backward=backward)
        whole_kwargs = {**kwargs, "cudagraphs": _no_cudagraphs()}
        resync = {"post_grad_custom_post_pass": self._resync_after(gm)}
        # A CPU graph has no sync left, nor a ``control_deps`` to pin one.
        reuse = {} if self.cpu else {**NO_BUFFER_REUSE, **control_deps_cached()}
        places = not inductor_runs_streams()  # the package places the nodes (2.11)
        if places:
            computed_early(gm)
            gm.meta[PLACED] = True  # (``inductor.placed_streams``)
        elif not self.cpu:
            computed_after_waits(gm)
        placed = PLACED_CONFIG if places else {}
        with keyed_by_streams(gm), inductor_config.patch({**reuse, **placed, **resync}):
            compiled = self.compile_region(gm, example_inputs, **whole_kwargs)
        if not self.cpu:  # (a CPU graph's reads were noted without its syncs)
            self._note_reads(gm, kwargs, compiled)
        return compiled

    def _resync_after(self, gm: torch.fx.GraphModule) -> Any:
        """The pass that puts the dealloc syncs Inductor's post-grad passes moved reads past
        back in place (``reuse_syncs.resync_after_post_grad``); with no table, no event
        orders anything (nor on CPU, where no sync is issued), and only the configured pass
        runs."""
        import torch._inductor.config as inductor_config

        configured = inductor_config.post_grad_custom_post_pass
        if self.table is None or self.cpu:
            return configured
        return reuse_syncs.resync_after_post_grad(gm, self.table, configured)

    def partitioned(self, gm: torch.fx.GraphModule, kwargs: dict[str, Any]) -> Any:
        self._note_reads(gm, kwargs)
        if getattr(kwargs.get("cudagraphs"), "value", False):
            backward = bool(kwargs.get("is_backward"))
            _skip_cudagraphs(gm, self.table, backward=backward, one_call=False)
        run_passes(gm, (FACTORIES_PASS,), self.compile_)
        require(gm, SPLIT_REQUIRES, "the region split", self.compile_)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        static = {placeholders[i] for i in kwargs.get("static_input_idxs", ()) or ()}
        slots: dict[torch.fx.Node, int] = {n: i for i, n in enumerate(gm.graph.nodes)}
        output = next(n for n in gm.graph.nodes if n.op == "output")
        steps: list[Step] = []
        _, issued = split_and_issued(gm, self.table)
        with _OutputStrides(output) as strides:
            for step in issued:
                if isinstance(step, SyncCall):
                    steps.append(Step(issuer(step.op), _refs(step.args, slots)))
                    continue
                compiled = self._region_step(gm, step, slots, static, kwargs, strides)
                if compiled is not None:
                    steps.append(compiled)
        name = self.table.graph_name if self.table is not None else "<graph>"
        log.debug("torch_userstreams: graph %s runs as %d steps", name, len(steps))
        program = Program(
            len(slots), [slots[n] for n in placeholders], steps, _refs(output.args[0], slots)
        )
        return program.boxed(backward=bool(kwargs.get("is_backward")))

    def _region_step(
        self,
        gm: torch.fx.GraphModule,
        region: Region,
        slots: dict[torch.fx.Node, int],
        static: set[torch.fx.Node],
        kwargs: dict[str, Any],
        strides: _OutputStrides,
    ) -> Step | None:
        _refuse_syncs_in_subgraphs(gm, region.nodes, self.table)
        module = region_module(gm, region)
        if not module.outputs and not has_side_effects(region):
            return None  # nothing it makes is used or written: no work to launch
        region_kwargs = dict(kwargs)
        region_kwargs["cudagraphs"] = _no_cudagraphs()
        region_kwargs["static_input_idxs"] = [
            i for i, node in enumerate(module.inputs) if node in static
        ]
        args = tuple(Ref(slots[node]) for node in module.inputs)
        outputs = tuple(slots[node] for node in module.outputs)
        if at_most_one_kernel(module.gm):
            # Nothing to fuse: run as is; ``forward``, so that no module hook of the user's
            # sees this internal graph. Views alone issue no work on any stream: the host
            # runs them without entering one.
            stream = None if kernels_launched(module.gm) == 0 else region.stream
            return Step(module.gm.forward, args, stream=stream, outputs=outputs)
        examples = [node.meta["val"] for node in module.inputs]
        with strides.region(module.outputs):
            compiled = self.compile_region(module.gm, examples, **region_kwargs)
        part_of_a_program(compiled)
        return Step(
            compiled,
            args,
            stream=region.stream,
            outputs=outputs,
            boxed=True,
            direct=_generated_call(compiled),
        )


def split_and_issued(
    gm: torch.fx.GraphModule, table: UserObjectTable | None
) -> tuple[list[Region | SyncCall], list[Region | SyncCall]]:
    """``gm`` as regions and syncs in issue order (``split``), and the subset of them this
    backend issues: the same list without the waits ``without_redundant_waits`` finds
    redundant. The demo's timeline reads it too, so it draws what runs."""
    holdable, current = made_by_the_package(table), the_current_stream(table)
    steps = split(gm, holdable, current)
    if not judged(table):
        return steps, steps
    shared, forward = frozenset(may_name_one(table)), not is_backward_graph(gm)
    return steps, without_redundant_waits(steps, holdable, current, shared, keep_records=forward)


def _refuse_syncs_in_subgraphs(
    gm: torch.fx.GraphModule, nodes: Iterable[torch.fx.Node], table: UserObjectTable | None
) -> None:
    """Nodes go to Inductor with their subgraphs, and Inductor mis-orders a sync inside a
    subgraph (it freed the branch's inputs before the kernel that read them)."""
    for node, op in syncs_in_subgraphs(gm, nodes):
        name = table.graph_name if table is not None else "<graph>"
        body, call = construct_names(node)
        raise UnsupportedPathError(
            f"torch_userstreams: graph {name}: an event is recorded or waited ({op}) inside "
            f"a {body}, on accelerator streams. Backend 'userstreams' compiles its streams "
            f"with Inductor, which cannot issue a sync inside a {body}. Record "
            f"and wait the event around {call} instead, or compile this function with "
            "backend='userstreams_aot_eager'."
        )


class _OutputStrides:
    """Inductor reports the strides of a forward graph's outputs to AOTAutograd through the
    tracing context, once per compile; the graph's outputs come from several regions here,
    so each region's report is collected and the graph's is assembled at the end (None for
    an output no region made: an input passed through)."""

    def __init__(self, output: torch.fx.Node) -> None:
        from torch._guards import TracingContext

        self.output = output
        self.context = TracingContext.try_get()
        self.reported = None if self.context is None else self.context.output_strides
        self.found: dict[torch.fx.Node, Any] = {}

    def __enter__(self) -> _OutputStrides:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.reported is None or self.context is None:
            return
        self.context.output_strides = self.reported
        if exc[0] is None:
            outputs = torch.fx.node.map_arg(self.output.args[0], lambda n: n)
            leaves = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
            self.reported.extend(self.found.get(alias_of(node)) for node in leaves)

    @contextlib.contextmanager
    def region(self, outputs: list[torch.fx.Node]) -> Iterator[None]:
        if self.reported is None or self.context is None:
            yield
            return
        self.context.output_strides = []
        yield
        self.found.update(zip(outputs, self.context.output_strides, strict=False))


def _refs(template: Any, slots: dict[torch.fx.Node, int]) -> Any:
    def ref(node: torch.fx.Node) -> Any:
        value = alias_of(node)
        return None if value is None else Ref(slots[value])

    return torch.fx.map_arg(template, ref)


def _generated_call(compiled: Any) -> Callable[..., Any] | None:
    """The ``call`` Inductor generated for a region (boxed, as the graph is), which its
    ``CompiledFxGraph`` wraps in per-call bookkeeping the region's launcher does not need
    once the region has run once: the launcher's direct entry. None for another compiler's
    result."""
    from torch._inductor.output_code import CompiledFxGraph

    if isinstance(compiled, CompiledFxGraph):
        return compiled.current_callable
    return None


def _skip_cudagraphs(
    gm: torch.fx.GraphModule, table: UserObjectTable | None, *, backward: bool, one_call: bool
) -> None:
    """Say, the way Inductor says its own skips (its ``cudagraphs`` log, the
    ``cudagraph_skips`` counter, an error under ``triton.cudagraph_or_error``), that a graph
    with streams runs without the CUDA graphs ``mode="reduce-overhead"`` asked for, and
    whether it could be captured at all: the CUDA stream-capture rules it breaks, if any
    (``capture_rules``), each with the stream or event, the line and the fix."""
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    from .capture_rules import capture_violations, describe

    name = table.graph_name if table is not None else "<graph>"
    graph = f"graph {name} ({'backward' if backward else 'forward'})"
    regions = (
        "backend 'userstreams' captures no graph with streams as CUDA graphs yet"
        if one_call
        else "backend 'userstreams' runs each stream region as a compiled call of its own, "
        "with the syncs between them issued by the host"
    )
    try:
        violations = capture_violations(gm, table)
    except Exception:  # the check only words the skip: it must never fail the compile
        log.debug("torch_userstreams: capture-rule check of %s failed", graph, exc_info=True)
        violations = None
    if violations is None:
        reason = f"{graph} uses streams, and {regions}. "
    elif violations:
        reason = (
            f"{graph} breaks {len(violations)} CUDA stream-capture rule(s), so it could not "
            f"be captured as written (and {regions}):\n{describe(violations)}\n"
        )
    else:
        reason = (
            f"{graph} uses streams and follows CUDA's stream-capture rules; it is skipped "
            f"only because {regions}. "
        )
    log_cudagraph_skip_and_bump_counter(
        f"skipping cudagraphs due to torch_userstreams: {reason}The graph runs without CUDA "
        "graphs. Graphs without streams are captured as with backend='inductor'."
    )


def stays_regions(gm: torch.fx.GraphModule) -> bool:
    """Whether a graph with streams compiles as regions even where one call is asked for:
    it would meet a failure of Inductor's own that a region does not."""
    return has_data_dependent_sizes(gm) or passes_a_folded_scatter_with_symbolic_views(gm)


_VIEW_SCATTERS = frozenset(
    {
        torch.ops.aten.slice_scatter.default,
        torch.ops.aten.select_scatter.default,
        torch.ops.aten.diagonal_scatter.default,
        torch.ops.aten.as_strided_scatter.default,
    }
)


def passes_a_folded_scatter_with_symbolic_views(gm: torch.fx.GraphModule) -> bool:
    """Whether a view-scatter writes into another one that something else reads too, with a
    symbolic size among its view's arguments.

    Inductor 2.12-2.15's reinplace pass folds such a pair into one scatter, then rebuilds
    the inner value for its other readers from the outer node's arguments after erasing
    that node: a size node reads as None there (``as_strided() Expected a value of type
    'List[int]'``). In one call the other reader is the sync that passes the inner value
    (a view of an input updated in place on a side stream, ``dynamic=True``); a region
    returns only what later regions read, and compiles."""
    for node in gm.graph.nodes:
        if node.target not in _VIEW_SCATTERS or len(node.args) < 2:
            continue
        inner = node.args[1]
        if (
            isinstance(inner, torch.fx.Node)
            and inner.target in _VIEW_SCATTERS
            and len(inner.users) > 1
            and any(isinstance(arg, torch.fx.Node) for arg in _leaves(node.args[2:]))
        ):
            return True
    return False


def _leaves(args: Any) -> list[Any]:
    from torch.utils._pytree import tree_leaves

    return list(tree_leaves(args))


def has_data_dependent_sizes(gm: torch.fx.GraphModule) -> bool:
    """Whether a value of ``gm`` has a size known only at run time (``u0``). Such a graph
    compiles as regions: Inductor 2.12-2.15 renames the size a sync passes through and
    fails (``AssertionError: u3 -> u0``), natively too."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    from torch.utils._pytree import tree_leaves

    symbolic = (torch.Tensor, torch.SymInt, torch.SymFloat, torch.SymBool)
    return any(
        free_unbacked_symbols(value)
        for node in gm.graph.nodes
        for value in tree_leaves(node.meta.get("val"))
        if isinstance(value, symbolic)
    )


def inductor_runs_streams() -> bool:
    """Whether this torch's Inductor runs each node of a graph on its own stream (2.12+)."""
    from torch._inductor.scheduler import Scheduler

    return hasattr(Scheduler, "_populate_stream_assignments")


def _not_python_wrapper() -> bool:
    """Whether Inductor writes C++ or FX wrapper code for the graph being compiled."""
    import torch._inductor.config as inductor_config

    return bool(inductor_config.cpp_wrapper or getattr(inductor_config, "fx_wrapper", False))


def can_compile_one_call() -> bool:
    """Whether a graph with streams compiles as one call: the package's patches of
    Inductor's scheduler and code are in place (``inductor.sync_order``,
    ``inductor.launch_code``; on 2.11, whose Inductor runs one stream,
    ``inductor.placed_streams`` places each node on its stream)."""
    from ..patch.install import is_installed

    return is_installed()


def _no_cudagraphs() -> Any:
    """A region is one piece of a graph: CUDA graphs would have to span the syncs too."""
    from torch._inductor.utils import BoxedBool

    return BoxedBool(False)


def compile_fx_with_streams(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    compile_: GraphCompile | None,
    compile_region: Compiler | None = None,
    on_graph: GraphHook | None = None,
    config_patches: dict[str, Any] | None = None,
    one_call: bool = False,
) -> Any:
    """Inductor's ``compile_fx`` with ``InductorGraphCompiler`` as its inner compiler:
    regions, or one compiled call per graph where ``one_call`` asks for it and it can be
    (``can_compile_one_call``).

    AOTAutograd's cache is bypassed for such graphs: a cache hit would skip the passes,
    and with them the events they request for this graph's table. The backward compiles
    with its forward, not lazily at its first run: Inductor's graph passes can move a read
    to another stream than the one that allocated its buffer (a transposed copy updated in
    place on a side stream), and only while the forward's backend runs can the graph get
    a new event to order that memory's reuse (``reuse_syncs``).
    """
    import torch._functorch.config as functorch_config
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    whole = one_call and can_compile_one_call()
    compiler = InductorGraphCompiler(
        compile_, compile_region or compile_fx_inner, on_graph, one_call=whole
    )
    inner = tagged(compiler)
    name = compile_.table.graph_name if compile_ is not None else "<graph>"
    log.info("torch_userstreams: graph %s bypasses AOTAutograd's cache (stream passes)", name)
    with functorch_config.patch(enable_autograd_cache=False, force_non_lazy_backward_lowering=True):
        return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=config_patches)
