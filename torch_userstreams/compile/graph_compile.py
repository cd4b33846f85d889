"""One graph compile: its table of user objects, its bound graph, and what its passes did.

Native Dynamo registers user objects in process-global tables. The package gives each graph
compile a ``GraphCompile`` instead, and every registration lands in the table of the graph at
hand. Which one that is, per thread (``run.state``: the compiles in progress, innermost
last):

* ``begin_frame()``: Dynamo starts compiling a frame; it gets a fresh compile, which the
  frame's graph adopts the first time it asks (Dynamo registers the ambient current stream
  before the graph exists);
* ``for_output_graph(og)``: the compile of the graph Dynamo traces (a restarted trace, with a
  new graph, gets a new compile);
* ``backend_running(compile)``: while the backend compiles the graph, requests from the
  backend and its passes (``active()``) land in that compile;
* ``current()``: where a registration made right now belongs: the innermost compile
  whose backend runs or whose frame Dynamo compiles (a backend may call another compiled
  function, whose frame is then compiled inside it), else the frame's (an error outside
  any compile).

Objects are requested with their provenance (who asked, for which phase) given by the asker.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import torch

from ..errors import NotCompilingError, UserObjectError
from ..run.state import compile_in_progress, state
from . import emitters, factories
from .table import EntryKind, Phase, Reader, UserObjectTable


@dataclass(eq=False)
class GraphCompile:
    """The state of one graph's compile (see the module docstring)."""

    table: UserObjectTable = field(default_factory=UserObjectTable)
    # The Dynamo OutputGraph this compile belongs to, once adopted. Held weakly: the compile
    # stays on the thread's stack until the next frame starts, the OutputGraph need not.
    _output_graph: weakref.ref[Any] | None = None
    backend_running: bool = False
    # The graph's BoundGraph once the backend returned, held weakly: the compiled frame
    # owns it, and a finished compile waits on the stack until the next frame starts.
    _bound: weakref.ref[Any] | None = None
    returns_objects: bool = False  # the bytecode after the call returns one of its objects
    # How many more times each of Dynamo's stream variables (by id: it lives while its
    # block is traced) was entered than its one native exit hook covers
    # (``patch.stream_blocks``: a stream's block nested in its own).
    reentered_streams: dict[int, int] = field(default_factory=dict)
    # Every table index the backend's compiled graphs read at run time, where the backend
    # knows them (``load_plan.report_reads``); None: any entry may be read.
    reported_reads: set[int] | None = None
    # AOTAutograd traced this graph's backward while the backend ran (its joint-graph pass
    # ran for this compile): its calls make AOTAutograd's Python node.
    backward_traced: bool = False
    # Dynamo's compile id of the frame this compile began for (``begin_frame``).
    frame_id: Any = None

    @property
    def bound(self) -> Any:
        return None if self._bound is None else self._bound()

    @bound.setter
    def bound(self, bound: Any) -> None:
        self._bound = weakref.ref(bound)

    @property
    def output_graph(self) -> Any:
        return None if self._output_graph is None else self._output_graph()

    def adopt(self, output_graph: Any) -> None:
        self._output_graph = weakref.ref(output_graph)
        self.table.graph_name = graph_name(output_graph)

    @property
    def adopted(self) -> bool:
        return self._output_graph is not None

    def traced_now(self) -> bool:
        """Dynamo compiles this compile's frame on this thread right now: traces its graph,
        or has begun the frame and has no graph yet."""
        output = self.output_graph
        if output is not None:
            return output is _translator_output()
        return self.frame_id is not None and self.frame_id == _compile_id()

    def example(self, index: int) -> Any:
        """The compile-time object at ``index`` (what a lookup returns while compiling)."""
        return self.table.example(index)

    def record_pass(self, pass_name: str, notes: list[str]) -> None:
        """What a pass changed, for ``explain()`` once the graphs are gone: each note is the
        record the pass left on the node it names (``fx.meta.record``)."""
        self.table.pass_notes.extend(f"{pass_name}: {note}" for note in notes)

    def mark_returns_objects(self) -> None:
        """The bytecode after the call returns one of its objects: keep the call's binding
        past the call. Dynamo may emit that bytecode before or after the backend ran."""
        self.returns_objects = True
        if self.bound is not None:
            self.bound.returns_objects = True

    # -- requests -------------------------------------------------------------------------

    def new_stream(
        self, device: torch.device, *, priority: int = 0, added_by: str, phase: Phase, text: str
    ) -> int:
        """A stream created fresh on each call, on ``device``, with ``priority``."""
        kwargs: dict[str, Any] = {"device": device}
        if priority:
            kwargs["priority"] = priority
        cls = factories.stream_class(device)
        return self._requested(cls, kwargs, text, added_by, phase, Reader.CODE)

    def new_event(
        self,
        device: torch.device,
        *,
        flags: dict[str, bool],
        added_by: str,
        phase: Phase,
        text: str,
        read_by: Reader = Reader.CODE,
    ) -> int:
        """An event created fresh on each call, on ``device``, with ``flags`` set; ``read_by``
        ``Reader.ADDED_NODES`` where only nodes the requester puts in the graphs read it."""
        kwargs: dict[str, Any] = {"device": device, **{k: v for k, v in flags.items() if v}}
        cls = factories.event_class(device)
        return self._requested(cls, kwargs, text, added_by, phase, read_by)

    def _requested(
        self,
        cls: type,
        kwargs: dict[str, Any],
        text: str,
        added_by: str,
        phase: Phase,
        read_by: Reader,
    ) -> int:
        _require_device(kwargs["device"], self.table.graph_name, added_by, text)
        factory = factories.constructor(cls, (), kwargs)
        example = factory()
        index = self.table.add(
            EntryKind.REQUESTED,
            text,
            emitters.from_factory(factory),
            example,
            added_by=added_by,
            phase=phase,
        )
        self.table.entries[index].reader = read_by
        return index

    def current_stream(
        self, device: torch.device, *, added_by: str, read_by: Reader = Reader.CODE
    ) -> int:
        """The entry of ``device``'s ambient stream at each call, added once, built for the
        requester's reads (``read_by``: ``Reader.ADDED_NODES`` where only nodes the requester
        puts in the graphs read it)."""
        index = self.current_stream_entry(device, added_by=added_by)
        entry = self.table.entries[index]
        entry.reader = max(entry.reader, read_by)
        return index

    def current_stream_entry(self, device: torch.device, *, added_by: str) -> int:
        """Like ``current_stream``, built only if the traced graph reads it (Dynamo's
        registration)."""
        entry = self.table.find_current_stream(device)
        if entry is not None:
            return entry.index
        if device.type == "cpu":
            # CPU has no stream switching: its current stream is the default CPU stream.
            factory = factories.constructor(factories.stream_class(device), (), {"device": device})
            emit, example = emitters.from_factory(factory), factory()
        else:
            wanted = f"the current stream of {str(device)!r}"
            _require_device(device, self.table.graph_name, added_by, wanted)
            emit = emitters.current_stream(device)
            example = torch.accelerator.current_stream(device)
        return self.table.add_current_stream(device, emit, example, added_by=added_by)


def _require_device(device: torch.device, graph: str, added_by: str, wanted: str) -> None:
    """CPU, or one of this machine's accelerator devices. Elsewhere torch answers
    "Accelerator expected", "not linked with support for cuda devices", "invalid device
    ordinal", or nothing until the first sync."""
    if device.type == "cpu":
        return
    available = torch.accelerator.is_available()  # a CUDA build without a GPU has none
    accelerator = torch.accelerator.current_accelerator() if available else None
    if accelerator is not None and accelerator.type == device.type:
        count = torch.accelerator.device_count()
        if device.index is None or device.index < count:
            return
        raise UserObjectError(
            f"{added_by} asked graph {graph} for {wanted}, but this machine has {count} "
            f"{device.type!r} device(s), numbered from 0: request an index below "
            f"torch.accelerator.device_count(), or the device without an index (its current "
            "one)."
        )
    present = "no accelerator" if accelerator is None else f"only {accelerator.type!r}"
    raise UserObjectError(
        f"{added_by} asked graph {graph} for {wanted}, but this machine has {present}: "
        "request objects of a device torch runs here (compile for that device, or guard the "
        "request with torch.accelerator.is_available())."
    )


# -- which compile a registration belongs to ------------------------------------------------


def _compiles() -> list[GraphCompile]:
    """This thread's compiles in progress (``run.state`` types them by what it reads)."""
    return cast("list[GraphCompile]", state.compiles)


def begin_frame() -> GraphCompile:
    """Dynamo starts compiling a frame: compiles no backend is running are dropped (a trace
    that failed, or made no graph), and the frame gets a fresh one."""
    compiles = _compiles()
    compiles[:] = [c for c in compiles if c.backend_running]
    fresh = GraphCompile(frame_id=_compile_id())
    compiles.append(fresh)
    return fresh


def for_output_graph(output_graph: Any) -> GraphCompile:
    """The compile of ``output_graph``, made or adopted on first use."""
    compiles = _compiles()
    for compile_ in reversed(compiles):
        if compile_.output_graph is output_graph:
            return compile_
    top = compiles[-1] if compiles else None
    if top is None or top.adopted or top.backend_running:
        top = GraphCompile()
        compiles.append(top)
    top.adopt(output_graph)
    return top


def _translator_output() -> Any:
    from torch._dynamo import symbolic_convert

    tx = getattr(symbolic_convert.tls, "current_tx", None)
    return None if tx is None else tx.output


def current(asker: str) -> GraphCompile:
    """The compile a registration made right now belongs to (see the module docstring);
    an error naming ``asker`` when Dynamo compiles nothing on this thread."""
    running = active_or_none()
    if running is not None:
        return running
    output = _translator_output()
    if output is not None:
        return for_output_graph(output)
    if not _frame_compiling():
        raise NotCompilingError(
            f"torch_userstreams: {asker} was called while torch.compile compiles nothing on "
            "this thread: it registers an object of the graph being compiled."
        )
    compiles = _compiles()
    return compiles[-1] if compiles else begin_frame()


def _compile_id() -> Any:
    """Dynamo's id of the frame it compiles on this thread now, or None."""
    from torch._guards import CompileContext

    return CompileContext.current_compile_id()


def _frame_compiling() -> bool:
    """Dynamo is compiling a frame on this thread (before its graph exists, too)."""
    return _compile_id() is not None


def active_or_none() -> GraphCompile | None:
    """The innermost compile whose backend is running on this thread, if any."""
    running = compile_in_progress()
    return running if isinstance(running, GraphCompile) and running.backend_running else None


def active(api_name: str) -> GraphCompile:
    """The compile whose backend is running; an error naming ``api_name`` outside one."""
    running = active_or_none()
    if running is not None:
        return running
    raise NotCompilingError(
        f"torch_userstreams.{api_name}() was called outside a compile. It requests an "
        "object for the graph being compiled, so call it from a backend (or a pass it runs) "
        "while torch.compile is compiling, with torch_userstreams installed. (The function "
        "you compile makes its own objects with torch.Stream(...), torch.Event(...) and "
        "torch.accelerator.current_stream(): Dynamo puts them in the graph's table.)"
        + _lazy_backward_hint()
    )


def _lazy_backward_hint() -> str:
    """A sentence for a request made while a backward runs: AOTAutograd compiles the
    backward graph there, lazily, after Dynamo's compile of the frame has ended."""
    if torch._C._current_autograd_node() is None:
        return ""
    return (
        " It was called while a backward runs. If that is an AOTAutograd bw_compiler, it "
        "compiles the backward lazily, after the frame's compile ended: request the "
        "backward's objects with phase='backward' while the forward compiles (in the "
        "backend or its fw_compiler), or set "
        "torch._functorch.config.force_non_lazy_backward_lowering = True so that the "
        "backward compiles with the forward."
    )


@contextlib.contextmanager
def backend_running(compile_: GraphCompile) -> Iterator[None]:
    """Route requests to ``compile_`` while its backend compiles the graph."""
    compile_.backend_running = True
    try:
        yield
    finally:
        compile_.backend_running = False


def graph_name(output_graph: Any) -> str:
    """A stable, readable name: the frame's function and Dynamo's compile id."""
    try:
        where = output_graph.root_tx.f_code.co_name
    except AttributeError:
        where = "<frame>"
    try:
        from torch._guards import CompileContext

        compile_id = CompileContext.current_compile_id()
        if compile_id is not None:
            return f"{where} [{compile_id}]"
    except Exception:  # pragma: no cover - naming must never break a compile
        pass
    return f"{where} [c{getattr(output_graph, 'compile_id', None)}]"


# -- explain() collects the tables of the graphs compiled meanwhile ----------------------------


class Collected(list[UserObjectTable]):
    """The tables of the graphs compiled on one thread, and how many graphs were compiled
    there in all (with or without user objects): Dynamo's own counters are process-wide, so
    another thread's compiles would count too."""

    graphs: int = 0


class _Collecting(threading.local):
    sink: Collected | None = None


_collecting = _Collecting()


def collected(table: UserObjectTable) -> None:
    """A graph's prologue is built: ``explain()`` (if it listens) gets its table."""
    if _collecting.sink is not None:
        _collecting.sink.append(table)


def graph_compiled() -> None:
    """Dynamo compiled a graph on this thread (``explain()`` counts them, if it listens)."""
    if _collecting.sink is not None:
        _collecting.sink.graphs += 1


@contextlib.contextmanager
def collecting_tables() -> Iterator[Collected]:
    """The tables of the graphs compiled on this thread meanwhile, in compile order."""
    previous = _collecting.sink
    sink = Collected()
    _collecting.sink = sink
    try:
        yield sink
    finally:
        _collecting.sink = previous
