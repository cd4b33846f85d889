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

from ..errors import UserObjectError

# Emits bytecode that pushes the object for one call onto the stack (a Dynamo PyCodegen).
Emitter = Callable[[Any], None]


class EntryKind(enum.Enum):
    """Where an entry's object comes from at run time."""

    INPUT = "input"  # loaded from the frame (argument, global, attribute) by its source
    GRAPH_CREATED = "graph-created"  # constructed by the user's function, fresh each call
    CURRENT_STREAM = "current-stream"  # the ambient current stream of a device
    REQUESTED = "requested"  # asked for by a backend or pass while compiling


class Reader(enum.IntEnum):
    """Who reads an entry at run time, which decides whether each call builds it (the
    load plan, ``compile.load_plan``). Ordered: a later request can only raise it."""

    # Dynamo's registration of the ambient current stream: built where the traced graph (or
    # a subgraph it calls) reads it.
    TRACED_GRAPH = 0
    # Read only through sync nodes a pass or backend puts in the graphs: built unless the
    # backend reported every index its compiled graphs read and neither they nor the traced
    # graph read this one.
    ADDED_NODES = 1
    # The frame's own object (an input, one the function creates) or one a backend or torch
    # reads from its own code: always built.
    CODE = 2


# Who reads an entry of each kind until a request says more: Dynamo's registration of the
# ambient stream, and a request, are read through graph nodes; the frame's objects by code.
_FIRST_READER = {
    EntryKind.CURRENT_STREAM: Reader.TRACED_GRAPH,
    EntryKind.REQUESTED: Reader.ADDED_NODES,
}


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
    reader: Reader = Reader.CODE  # ``UserObjectTable.add`` gives each kind its own
    # The device of the object (a stream's or an event's), kept after the example is dropped.
    device: torch.device | None = None
    # The compile-time value (Dynamo runs lookup nodes on it while tracing); dropped by
    # ``release_examples`` once the graph is compiled, so the table owns no user object.
    example: Any = field(default=None, repr=False)

    @property
    def made_for_the_package(self) -> bool:
        """A request only the package's own sync nodes read: no user code records, waits,
        times or queries it, and no backend code holds it."""
        return self.kind is EntryKind.REQUESTED and self.reader is not Reader.CODE

    def describe(self, loaded: bool = True) -> str:
        flags = "" if loaded else " (unused: not loaded)"
        return (
            f"[{self.index}] {self.kind.value:<14} {self.phase.value:<8} "
            f"{self.example_type:<12} {self.origin}  (added by {self.added_by}){flags}"
        )


class HandOver(enum.Enum):
    """Whether a call hands its binding to the autograd nodes it made, so that their backward
    resolves user objects against the call's own (``run.backward.attach``)."""

    # No backward of this graph reads a user object: nothing to hand over.
    NONE = "none"
    # AOTAutograd traced this graph's backward: a call that makes autograd nodes makes its
    # Python node (unless the backend ran the call some other way), which gets the binding;
    # a call whose walk finds none just pays the walk. An AOTAutograd cache hit traces
    # nothing, and the graph is watched as a foreign backend's.
    EVERY_CALL = "every call"
    # A backend the package cannot see into: hand over while the calls make a Python node,
    # and stop after ``run.bound_graph.CALLS_WITHOUT_A_PYTHON_NODE`` calls in a row make
    # none (a backend that runs the graph eagerly pays the walk for those only).
    WHILE_FOUND = "while found"


@dataclass(frozen=True)
class LoadPlan:
    """The indices each call builds, and how calls hand their binding to the backward.
    Made once, when the backend returned (``compile.load_plan``)."""

    loaded: frozenset[int]
    hand_over: HandOver

    @property
    def backward_bound(self) -> bool:
        """Whether calls hand their binding to the backward at all."""
        return self.hand_over is not HandOver.NONE

    @property
    def loads_any(self) -> bool:
        """Whether the prologue has anything to build (else the graph gets none)."""
        return bool(self.loaded)


class UserObjectTable:
    """Entries of one compiled graph, in index order."""

    def __init__(self, graph_name: str = "<graph being traced>") -> None:
        self.graph_name = graph_name
        self.entries: list[Entry] = []
        self.prologue_listing = ""  # filled when the prologue is generated
        # What the package's passes changed in this graph's FX graphs, as "pass: note".
        self.pass_notes: list[str] = []
        # Which entries each call builds, decided once when the prologue is generated
        # (``compile.load_plan``); None until then.
        self.plan: LoadPlan | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def loads(self, index: int) -> bool:
        """Whether each call builds entry ``index`` (all do until the plan is made)."""
        return self.plan is None or index in self.plan.loaded

    def add(
        self,
        kind: EntryKind,
        origin: str,
        emit: Emitter,
        example: Any,
        *,
        added_by: str,
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
                reader=_FIRST_READER.get(kind, Reader.CODE),
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
        if isinstance(index, int) and 0 <= index < len(self.entries):
            return self.entries[index].example
        raise UserObjectError(
            f"torch_userstreams: graph {self.graph_name} has no user object at index "
            f"{index!r} while compiling (its table has {len(self.entries)} entries)."
        )

    def release_examples(self) -> None:
        for entry in self.entries:
            entry.example = None

    def find_current_stream(self, device: torch.device) -> Entry | None:
        """The entry of ``device``'s ambient current stream, if the table has one."""
        for entry in self.entries:
            if entry.kind is EntryKind.CURRENT_STREAM and entry.device == device:
                return entry
        return None

    def add_current_stream(
        self, device: torch.device, emit: Emitter, example: Any, *, added_by: str
    ) -> int:
        """The entry of ``device``'s ambient current stream, as it is at each call."""
        origin = f"current stream of {device}"
        index = self.add(EntryKind.CURRENT_STREAM, origin, emit, example, added_by=added_by)
        self.entries[index].device = device  # the device asked for, even if the stream's differs
        return index

    def current_streams(self) -> dict[str, int]:
        """{device: index} of the current-stream entries."""
        return {
            str(entry.device): entry.index
            for entry in self.entries
            if entry.kind is EntryKind.CURRENT_STREAM
        }

    def describe(self, *, pass_notes: bool = True) -> str:
        lines = [f"user objects of graph {self.graph_name}: {len(self.entries)}"]
        lines.extend("  " + entry.describe(self.loads(entry.index)) for entry in self.entries)
        if pass_notes and self.pass_notes:
            lines.append("what the passes did:")
            lines.extend("  " + note for note in self.pass_notes)
        return "\n".join(lines)


def _device_of(example: Any) -> torch.device | None:
    device = getattr(example, "device", None)
    return device if isinstance(device, torch.device) else None


def all_on_cpu(table: UserObjectTable | None) -> bool:
    """Whether every stream and event of the graph's table is a CPU object."""
    if table is None:
        return True
    return all(entry.device is None or entry.device.type == "cpu" for entry in table.entries)
