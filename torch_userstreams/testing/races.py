"""A run-time race detector for simulated streams: what would race on a GPU, found on CPU.

``detect_races()`` watches everything that runs inside it, eager and compiled, forward and
backward, and orders it as a GPU would:

* each kernel: every aten op the dispatcher runs (each node of ``userstreams_aot_eager``,
  each op of a region run as its graph, the autograd engine's own ops, the user's eager
  code), and each C++ kernel of Inductor's compiled code, with what it reads and writes
  (``compiled_kernels``: native Inductor 2.12+ runs a graph's streams in one call); code it
  cannot see into counts as one kernel that reads its tensor inputs and writes its outputs
  and the inputs it mutates. Each runs on the stream entered last
  (``with stream:``) inside the block, else on the current stream. The autograd engine's
  ops for eager code run there too, where a GPU runs each on its forward op's stream: eager
  backward work after side-stream forward work can be reported falsely;
* each sync made on a simulated stream or event (``observe``): record, wait, wait_stream,
  synchronize;
* each storage: which kernel allocated it, on which stream, and when it is freed.

Rules: ``happens_before.StreamClocks`` (program order per stream, events, wait_stream, host
syncs). Reported, each naming the ops, the streams and the fix:

* data races: two accesses of one storage from different streams, at least one a write,
  with the earlier not ordered before the later (RAW, WAR, WAW);
* memory reuse: a storage freed while a stream other than its allocating one may still
  use it, judged when the allocating stream next allocates (the caching allocator may hand
  the block out then) or when the detector ends (the caller allocates there next).

Use it with ``fake_accelerator(gpu_semantics=True)`` and compile inside it: the package then
places the syncs a GPU graph gets, and the streams are simulated ones this module sees. With
CPU streams (``SimStream(device="cpu")``) the package rightly places no sync at all (CPU work
runs in program order), so the detector would report races a CPU cannot have.

What it cannot see: work on native (non-simulated) streams (a native current stream is a
new Python object at each query, so it is no key either), streams entered before the block,
``record_stream`` (it has no CPU kernel), kernels of compiled code that is not Inductor's
(or are Inductor's GPU kernels), and the frees of tensors a compiled forward saves for its
backward (all it returns is taken as the caller's).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from ..observe import tensors_in, watching
from .compiled_kernels import seen_kernel_by_kernel
from .happens_before import StreamClocks
from .hazards import Finding, HazardKind

CURRENT = "the current stream"


@dataclass
class _Access:
    tick: int
    label: str


@dataclass
class _Storage:
    """What the detector knows of one storage while it lives."""

    ref: StorageWeakRef
    stream: int  # the allocating stream's key; -1 for storages made before the detector
    label: str
    reads: dict[int, _Access] = field(default_factory=dict)  # stream key -> latest read
    writes: dict[int, _Access] = field(default_factory=dict)  # stream key -> latest write
    record_streams: set[int] = field(default_factory=set)
    escaped: bool = False  # returned by compiled code: the caller owns its memory

    def foreign(self) -> dict[int, _Access]:
        """The latest access from each stream other than the allocating one."""
        found: dict[int, _Access] = {}
        for accesses in (self.reads, self.writes):
            for stream, access in accesses.items():
                if stream != self.stream and stream not in self.record_streams:
                    if stream not in found or found[stream].tick < access.tick:
                        found[stream] = access
        return found


@dataclass
class RaceReport:
    """What one ``detect_races()`` block found; truthy when it found nothing."""

    findings: list[Finding] = field(default_factory=list)
    kernels: int = 0
    syncs: int = 0

    def __bool__(self) -> bool:
        return not self.findings

    def __str__(self) -> str:
        seen = f"{self.kernels} kernel(s), {self.syncs} sync(s) watched"
        if not self.findings:
            return f"no races ({seen})"
        lines = [f"{len(self.findings)} race(s) ({seen}):"]
        lines.extend(f"  {finding}" for finding in self.findings)
        return "\n".join(lines)

    def assert_no_races(self) -> None:
        """Raise ``AssertionError`` with the findings if there are any."""
        if self.findings:
            raise AssertionError(str(self))


class RaceDetector(TorchDispatchMode):
    """The detector behind ``detect_races`` (see the module docstring). Streams and events
    are keyed by identity (CPU streams all compare equal) and kept alive while it runs."""

    def __init__(self, names: Mapping[str, torch.Stream] | None = None) -> None:
        super().__init__()
        self.report = RaceReport()
        self._clocks = StreamClocks()
        self._objects: dict[int, Any] = {}
        self._names: dict[int, str] = {id(s): n for n, s in (names or {}).items()}
        self._storages: dict[int, _Storage] = {}
        self._stream_order: list[int] = []
        self._threads = threading.local()
        self._reported: set[tuple[Any, ...]] = set()
        self._lock = threading.RLock()

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Off while torch.compile compiles (Dynamo would otherwise run the function
        eagerly), on while what it compiled runs."""
        return True

    # -- streams -----------------------------------------------------------------------

    def _key(self, obj: Any) -> int:
        """An event's key; a stream's (see ``_skey``)."""
        self._objects.setdefault(id(obj), obj)
        return id(obj)

    def _skey(self, stream: Any) -> int:
        key = self._key(stream)
        if key not in self._stream_order:
            self._stream_order.append(key)
        return key

    def _stack(self) -> list[torch.Stream]:
        stack = getattr(self._threads, "stack", None)
        if stack is None:
            stack = self._threads.stack = []
        return stack

    def _current(self) -> int:
        stack = self._stack()
        if stack:
            return self._skey(stack[-1])
        return self._skey(_ambient())

    def _stream(self, stream: torch.Stream | None) -> int:
        return self._current() if stream is None else self._skey(stream)

    def name(self, key: int) -> str:
        """How a report names the stream ``key``."""
        if key in self._names:
            return self._names[key]
        obj = self._objects.get(key)
        if obj is None or obj is _ambient() or isinstance(obj, str):
            return CURRENT
        unnamed = [k for k in self._stream_order if k not in self._names]
        ambient = id(_ambient())
        return f"stream #{[k for k in unnamed if k != ambient].index(key)}"

    # -- the observer protocol (``observe.Observer``) ------------------------------------

    def enter(self, stream: torch.Stream) -> None:
        self._stack().append(stream)

    def exit(self, stream: torch.Stream) -> None:
        stack = self._stack()
        if stack and stack[-1] is stream:
            stack.pop()

    def record(self, event: torch.Event, stream: torch.Stream | None) -> None:
        with self._lock:
            self.report.syncs += 1
            self._clocks.record(self._key(event), self._stream(stream))

    def wait(self, event: torch.Event, stream: torch.Stream | None) -> None:
        with self._lock:
            self.report.syncs += 1
            self._clocks.wait_event(self._key(event), self._stream(stream))

    def wait_stream(self, waiting: torch.Stream, waited_on: torch.Stream) -> None:
        with self._lock:
            self.report.syncs += 1
            self._clocks.wait_stream(self._skey(waiting), self._skey(waited_on))

    def synchronize(self, obj: torch.Stream | torch.Event) -> None:
        with self._lock:
            self.report.syncs += 1
            if isinstance(obj, torch.Event):
                self._clocks.synchronize_event(self._key(obj))
            else:
                self._clocks.synchronize_stream(self._skey(obj))

    def kernel(
        self, name: str, reads: Sequence[torch.Tensor], writes: Sequence[torch.Tensor]
    ) -> None:
        self._issue(name, reads, writes, allocated=())

    def whole_call(
        self, reads: list[torch.Tensor], writes: list[torch.Tensor], out: list[torch.Tensor]
    ) -> None:
        """Compiled code it cannot see into, as one kernel (``compiled_kernels``)."""
        inputs = {_storage_key(t) for t in (*reads, *writes) if _has_storage(t)}
        made = [t for t in out if _storage_key(t) not in inputs]
        self._issue("compiled graph", reads, writes, allocated=made)

    def escape(self, values: Any) -> None:
        with self._lock:
            for tensor in tensors_in(values):
                storage = self._storages.get(_storage_key(tensor))
                if storage is not None:
                    storage.escaped = True

    # -- aten ops ----------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is torch.ops.aten.record_stream.default:
            self._record_stream(args[0], args[1])
            return out
        reads, writes = _schema_accesses(func, args, kwargs)
        if reads or writes or not _returns_alias(func):
            inputs = {_storage_key(t) for t in (*reads, *writes)}
            made = [t for t in tensors_in(out) if _storage_key(t) not in inputs]
            self._issue(_label(func), reads, writes, allocated=made)
        return out

    def _record_stream(self, tensor: torch.Tensor, stream: torch.Stream) -> None:
        with self._lock:
            storage = self._storages.get(_storage_key(tensor))
            if storage is not None:
                storage.record_streams.add(self._skey(stream))

    # -- accesses ----------------------------------------------------------------------

    def _issue(
        self,
        name: str,
        reads: Sequence[torch.Tensor],
        writes: Sequence[torch.Tensor],
        allocated: Sequence[torch.Tensor],
    ) -> None:
        tracked = [t for t in (*reads, *writes, *allocated) if _has_storage(t)]
        if not tracked:
            return
        with self._lock:
            stream = self._current()
            self.report.kernels += 1
            label = _where(name)
            fresh = [t for t in allocated if _has_storage(t) and self._is_new(t)]
            if fresh:
                self._check_reuse(stream)
            tick = self._clocks.issue(stream)[stream]
            for tensor in fresh:
                self._allocate(tensor, stream, label)
            write_keys = {_storage_key(t) for t in writes if _has_storage(t)}
            write_keys |= {_storage_key(t) for t in allocated if _has_storage(t)}
            for tensor in reads:
                if _has_storage(tensor) and _storage_key(tensor) not in write_keys:
                    self._access(tensor, stream, tick, label, write=False)
            for tensor in (*writes, *allocated):
                if _has_storage(tensor):
                    self._access(tensor, stream, tick, label, write=True)

    def _is_new(self, tensor: torch.Tensor) -> bool:
        storage = self._storages.get(_storage_key(tensor))
        return storage is None or storage.ref.expired()

    def _allocate(self, tensor: torch.Tensor, stream: int, label: str) -> None:
        """A storage's key cannot be reused while its record's weak reference lives, so no
        live record is overwritten here."""
        key = _storage_key(tensor)
        self._storages[key] = _Storage(StorageWeakRef(tensor.untyped_storage()), stream, label)

    def _known(self, tensor: torch.Tensor, stream: int, label: str, write: bool) -> _Storage:
        """The storage's record. One never seen is an input made before the detector
        started, ready for every stream; or, written first, memory that compiled code
        allocated unseen (an ``out=`` kernel's buffer) on this stream."""
        key = _storage_key(tensor)
        storage = self._storages.get(key)
        if storage is None or storage.ref.expired():
            owner, made_by = (stream, label) if write else (-1, "an input")
            storage = _Storage(StorageWeakRef(tensor.untyped_storage()), owner, made_by)
            self._storages[key] = storage
        return storage

    def _access(
        self, tensor: torch.Tensor, stream: int, tick: int, label: str, *, write: bool
    ) -> None:
        storage = self._known(tensor, stream, label, write)
        earlier = [(HazardKind.RAW if not write else HazardKind.WAW, storage.writes)]
        if write:
            earlier.append((HazardKind.WAR, storage.reads))
        for kind, accesses in earlier:
            for other, access in accesses.items():
                if other != stream and not self._ordered(other, access.tick, stream):
                    self._race(kind, storage, other, access, stream, label)
        mine = storage.writes if write else storage.reads
        mine[stream] = _Access(tick, label)
        if write:  # later accesses need only be ordered after this write (FastTrack)
            for accesses in (storage.reads, storage.writes):
                for other in [s for s in accesses if s != stream]:
                    if self._ordered(other, accesses[other].tick, stream):
                        del accesses[other]

    def _ordered(self, stream: int, tick: int, later: int) -> bool:
        return self._clocks.seen_by(later, stream, tick)

    # -- memory reuse -------------------------------------------------------------------

    def _check_reuse(self, stream: int) -> None:
        """``stream`` allocates: the caching allocator may hand it any block freed on it."""
        for key, storage in list(self._storages.items()):
            if storage.stream == stream and storage.ref.expired():
                self._judge_free(storage, reuse=stream)
                del self._storages[key]

    def _judge_free(self, storage: _Storage, reuse: int | None) -> None:
        """Memory that compiled code returned is the caller's to sync, as in the static
        checker: eager code and the autograd engine use and free it as they would any
        tensor the user made on that stream."""
        if storage.stream < 0 or storage.escaped:
            return
        for other, access in storage.foreign().items():
            if not self._ordered(other, access.tick, storage.stream):
                self._reuse(storage, other, access, reuse is None)

    def finish(self) -> RaceReport:
        """The end of the block: a freed storage is judged against its stream's clock now
        (the caller's next allocation there may take it)."""
        with self._lock:
            for storage in self._storages.values():
                if storage.ref.expired():
                    self._judge_free(storage, reuse=None)
            self._storages.clear()
        return self.report

    # -- findings ----------------------------------------------------------------------

    def _race(
        self,
        kind: HazardKind,
        storage: _Storage,
        first_stream: int,
        first: _Access,
        second_stream: int,
        second: str,
    ) -> None:
        key = (kind, first.label, first_stream, second_stream, storage.label)
        if key in self._reported:
            return
        self._reported.add(key)
        s, t = self.name(first_stream), self.name(second_stream)
        verb = "reads" if kind is HazardKind.RAW else "writes"
        self.report.findings.append(
            Finding(
                kind=kind,
                buffer=storage.label,
                first=first.label,
                first_stream=first_stream,
                second=second,
                second_stream=second_stream,
                fix=f"record an event on {s} after {first.label} and wait for it on {t} "
                f"before {second}",
                detail=f"{second} on {t} {verb} memory allocated by {storage.label} while "
                f"{first.label} on {s} may still access it",
            )
        )

    def _reuse(self, storage: _Storage, other: int, last: _Access, at_end: bool) -> None:
        key = ("reuse", storage.label, other, last.label)
        if key in self._reported:
            return
        self._reported.add(key)
        a, b = self.name(storage.stream), self.name(other)
        when = "after the block" if at_end else "at its next allocation"
        self.report.findings.append(
            Finding(
                kind=HazardKind.MEMORY_REUSE,
                buffer=storage.label,
                first=last.label,
                first_stream=other,
                second="<free>",
                second_stream=storage.stream,
                fix=f"before the tensor is freed, make {a} wait for an event recorded on {b} "
                f"after {last.label} (what sync_dealloc does)",
                detail=f"memory allocated by {storage.label} on {a} was freed while "
                f"{last.label} on {b} may still use it; {a} may reuse it {when}",
            )
        )


@contextlib.contextmanager
def detect_races(names: Mapping[str, torch.Stream] | None = None) -> Iterator[RaceReport]:
    """Watch everything run inside the block; yields the report, complete when the block
    ends. ``names`` names streams in the findings ({"side": side}); others are "the current
    stream" or "stream #k"."""
    detector = RaceDetector(names)
    with watching(detector), detector, seen_kernel_by_kernel(detector, detector.whole_call):
        yield detector.report
    detector.finish()


# -- helpers ------------------------------------------------------------------------------


def _ambient() -> Any:
    """The current stream when no ``with stream:`` block is open."""
    if torch.accelerator.is_available():
        return torch.accelerator.current_stream()
    return CURRENT


def _has_storage(tensor: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(tensor, FakeTensor) or tensor.is_meta or tensor.is_sparse:
        return False
    try:
        tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _storage_key(tensor: torch.Tensor) -> int:
    if not _has_storage(tensor):
        return -id(tensor)
    return int(tensor.untyped_storage()._cdata)


def _schema_accesses(
    func: Any, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The tensors an op reads and writes, from its schema: an argument with a write alias
    (``Tensor(a!)``) is written, one a view is taken of (``Tensor(a)``) not accessed,
    every other tensor argument read."""
    reads: list[torch.Tensor] = []
    writes: list[torch.Tensor] = []
    schema = getattr(func, "_schema", None)
    if schema is None:
        return tensors_in(list(args) + list(kwargs.values())), []
    for position, argument in enumerate(schema.arguments):
        if argument.kwarg_only or position >= len(args):
            value = kwargs.get(argument.name)
        else:
            value = args[position]
        alias = argument.alias_info
        if alias is not None and not alias.is_write:
            continue  # a view's base (``Tensor(a)``): the view reads nothing of it
        (writes if alias is not None else reads).extend(tensors_in(value))
    return reads, writes


def _returns_alias(func: Any) -> bool:
    """A view op (its outputs alias an input, nothing written): it launches no kernel."""
    schema = getattr(func, "_schema", None)
    return schema is not None and any(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns
    )


def _label(func: Any) -> str:
    name = str(getattr(func, "__name__", func))
    return name.removesuffix(".default")


_OWN_FILES = (f"{os.sep}torch_userstreams{os.sep}", f"{os.sep}torch{os.sep}")


def _where(name: str) -> str:
    """``name`` with where it was issued: the graph whose call runs it, else the user's
    line (eager code)."""
    from ..run.backward import backward_binding
    from ..run.binding import graph_of
    from ..run.state import state

    binding = state.calls.current or backward_binding()
    if binding is not None:
        return f"{name} (graph {graph_of(binding).table.graph_name})"
    frame = sys._getframe(2)
    while frame is not None and any(part in frame.f_code.co_filename for part in _OWN_FILES):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return f"{name} (eager)"
    return f"{name} (eager, {frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno})"


__all__ = ["RaceDetector", "RaceReport", "detect_races"]
