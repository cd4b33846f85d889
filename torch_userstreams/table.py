"""The user-object table of one compiled graph.

Native Dynamo keeps user objects (streams, events) in process-global tables indexed by
registration order. We keep one table per backend compile instead: the index an FX node
or a ``streams::*`` op carries is an index into *its own graph's* table, so no other graph,
thread or compile can overwrite it.
"""

from __future__ import annotations

import enum
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .errors import UserObjectError

# Emits bytecode that pushes the object for one call onto the stack (a Dynamo PyCodegen).
Emitter = Callable[[Any], None]


class EntryKind(enum.Enum):
    """Where an entry's object comes from at run time."""

    INPUT = "input"  # loaded from the frame (argument, global, attribute) by its source
    GRAPH_CREATED = "graph-created"  # constructed by the user's function, fresh each call
    CURRENT_STREAM = "current-stream"  # the ambient current stream of a device
    REQUESTED = "requested"  # asked for by a backend or pass while compiling


class Phase(enum.Enum):
    """Which graph reads the entry: the forward, or only the backward."""

    FORWARD = "forward"
    BACKWARD = "backward"


@dataclass
class Entry:
    """One user object of a graph: what it is, how each call gets it, and who added it."""

    index: int
    kind: EntryKind
    origin: str
    emit: Emitter
    example_type: str
    added_by: str = "dynamo"
    phase: Phase = Phase.FORWARD
    # False for an ambient current stream no node reads: its prologue load is skipped.
    live: bool = True
    # True when a backend or pass asked for it, so it is loaded even if no node reads it.
    requested: bool = False
    # The device of the object (a stream's or an event's), kept after the example is dropped.
    device: torch.device | None = None
    # The compile-time value (Dynamo runs lookup nodes on it while tracing); dropped by
    # ``release_examples`` once the graph is compiled, so the table owns no user object.
    example: Any = field(default=None, repr=False)

    @property
    def held_strongly(self) -> bool:
        """Only inputs belong to the user; whatever the call makes it keeps alive itself.

        The ambient current stream counts as made by the call: ``current_stream()`` returns
        a fresh wrapper object each time, which nothing else would keep alive.
        """
        return self.kind is not EntryKind.INPUT

    def describe(self) -> str:
        flags = "" if self.live else " (unused: not loaded)"
        return (
            f"[{self.index}] {self.kind.value:<14} {self.phase.value:<8} "
            f"{self.example_type:<12} {self.origin}  (added by {self.added_by}){flags}"
        )


class UserObjectTable:
    """Entries of one compiled graph, in index order."""

    def __init__(self, graph_name: str = "<graph being traced>") -> None:
        self.graph_name = graph_name
        self.entries: list[Entry] = []
        self.prologue_listing = ""  # filled when the prologue is generated
        # What the package's passes changed in this graph's FX graphs, as "pass: note".
        self.pass_notes: list[str] = []

    def __len__(self) -> int:
        return len(self.entries)

    def __bool__(self) -> bool:
        return any(entry.live for entry in self.entries)

    def add(
        self,
        kind: EntryKind,
        origin: str,
        emit: Emitter,
        example: Any,
        *,
        added_by: str = "dynamo",
        phase: Phase = Phase.FORWARD,
    ) -> int:
        """Append an entry and return its index; the example must be weak-referenceable."""
        try:
            weakref.ref(example)
        except TypeError as exc:
            raise UserObjectError(
                f"torch_userstreams: cannot use {example!r} ({type(example).__name__}) as a "
                f"user object of graph {self.graph_name}: it cannot be weak-referenced. "
                "User objects must be torch.Stream/torch.Event (or subclasses); pass other "
                "values as tensors or constants instead."
            ) from exc
        index = len(self.entries)
        self.entries.append(
            Entry(
                index=index,
                kind=kind,
                origin=origin,
                emit=emit,
                example_type=type(example).__name__,
                added_by=added_by,
                phase=phase,
                device=_device_of(example),
                example=example,
            )
        )
        return index

    def device(self, index: int) -> torch.device:
        """The device of the stream or event at ``index``."""
        device = self.entries[index].device if 0 <= index < len(self.entries) else None
        if device is None:
            raise UserObjectError(
                f"torch_userstreams: user object {index} of graph {self.graph_name} has no "
                "device: it is not a stream or event of this graph."
            )
        return device

    def example(self, index: int) -> Any:
        """The compile-time object at ``index`` (what a lookup returns while compiling)."""
        try:
            return self.entries[index].example
        except IndexError:
            raise UserObjectError(
                f"torch_userstreams: graph {self.graph_name} has no user object at index "
                f"{index} while compiling (its table has {len(self.entries)} entries)."
            ) from None

    def release_examples(self) -> None:
        for entry in self.entries:
            entry.example = None

    def find(self, kind: EntryKind, origin: str) -> Entry | None:
        for entry in self.entries:
            if entry.kind is kind and entry.origin == origin:
                return entry
        return None

    def describe(self) -> str:
        lines = [f"user objects of graph {self.graph_name}: {len(self.entries)}"]
        lines.extend("  " + entry.describe() for entry in self.entries)
        if self.pass_notes:
            lines.append("added by passes:")
            lines.extend("  " + note for note in self.pass_notes)
        return "\n".join(lines)


def _device_of(example: Any) -> torch.device | None:
    device = getattr(example, "device", None)
    return device if isinstance(device, torch.device) else None
