"""A CPU stream simulator: streams and events whose syncs are recorded, ordered no-ops.

CPU runs every op in program order, so a sync never changes a value there, but native CPU
events refuse to ``record()`` and CPU streams refuse ``wait_stream``. The prologue builds
these subclasses for CPU objects so compiled code with syncs runs on CPU, and each object
keeps a log of the latest syncs made on it (``LOG_LIMIT``), which tests use to check that
a call (and its backward) used its own objects. A watcher (``observe``, the run-time race
detector) is told each stream entered and each sync, so it can order the work issued on
these streams as a GPU would.
"""

from __future__ import annotations

from typing import Any

import torch

from .observe import watcher

# The most syncs an object's log keeps. A stream made once and passed to every step of a CPU
# training run is synced on each step: an unbounded log would grow for the whole run.
LOG_LIMIT = 4096


class _Log:
    """``log``: an object's latest syncs, oldest first, made on first read. A non-data
    descriptor, so that once made the list is a plain attribute of the object: a sync
    reads it with no call of its own."""

    def __get__(self, obj: Any, owner: type | None = None) -> list[tuple[str, Any]]:
        if obj is None:
            return self  # type: ignore[return-value]
        log: list[tuple[str, Any]] = obj.__dict__.setdefault("log", [])
        return log


def _add(log: list[tuple[str, Any]], entry: tuple[str, Any]) -> None:
    """Append ``entry`` to ``log``; past ``LOG_LIMIT`` entries, the older half goes first."""
    if len(log) >= LOG_LIMIT:
        del log[: len(log) - LOG_LIMIT // 2]
    log.append(entry)


# torch.Stream's own block methods, called without ``super()``'s lookup on each entry.
_enter, _exit = torch.Stream.__enter__, torch.Stream.__exit__


class SimStream(torch.Stream):
    """A ``torch.Stream`` on CPU whose sync methods succeed and are logged."""

    def __enter__(self) -> SimStream:
        _enter(self)
        observer = watcher()
        if observer is not None:
            observer.enter(self)
        return self

    def __exit__(self, *exc: object) -> None:
        observer = watcher()
        if observer is not None:
            observer.exit(self)
        _exit(self, *exc)

    log = _Log()

    def wait_stream(self, stream: torch.Stream) -> None:  # type: ignore[override]
        _add(self.log, ("wait_stream", stream))
        observer = watcher()
        if observer is not None:
            observer.wait_stream(self, stream)

    def wait_event(self, event: torch.Event) -> None:  # type: ignore[override]
        _add(self.log, ("wait_event", event))
        if isinstance(event, SimEvent):
            _add(event.log, ("waited_by", self))
        observer = watcher()
        if observer is not None:
            observer.wait(event, self)

    def record_event(self, event: torch.Event | None = None) -> torch.Event:  # type: ignore[override]
        event = SimEvent(device="cpu") if event is None else event
        event.record(self)
        return event

    def synchronize(self) -> None:
        _add(self.log, ("synchronize", None))
        observer = watcher()
        if observer is not None:
            observer.synchronize(self)


class SimEvent(torch.Event):
    """A ``torch.Event`` on CPU whose record and wait succeed and are logged."""

    log = _Log()

    def record(self, stream: torch.Stream | None = None) -> None:  # type: ignore[override]
        _add(self.log, ("record", stream))
        observer = watcher()
        if observer is not None:
            observer.record(self, stream)

    def wait(self, stream: torch.Stream | None = None) -> None:  # type: ignore[override]
        _add(self.log, ("wait", stream))
        observer = watcher()
        if observer is not None:
            observer.wait(self, stream)

    def synchronize(self) -> None:
        _add(self.log, ("synchronize", None))
        observer = watcher()
        if observer is not None:
            observer.synchronize(self)

    def query(self) -> bool:
        return True

    @property
    def recorded(self) -> bool:
        return any(kind == "record" for kind, _ in self.log)

    @property
    def waited(self) -> bool:
        return any(kind in ("wait", "waited_by") for kind, _ in self.log)
