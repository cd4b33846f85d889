"""What a timeline drawing shows: lanes (one per stream), boxes, sync markers and arrows.

Two sources fill it: the stream schedule of the captured FX graphs (``schedule``, x is the
position in the order the compiled program issues its work) and a CUDA profiler trace
(``trace``, x is microseconds). ``render`` draws either as SVG or an image, ``chrome`` writes
either as a Chrome trace; the ``caption`` says what x is and whether the syncs drawn ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KERNEL = "kernel"
RECORD = "record"
WAIT = "wait"
SYNC = "sync"
MICROSECONDS = "microseconds"  # the unit of a profiled timeline: x is real time


@dataclass(frozen=True)
class Box:
    """Work (or a sync, drawn as a marker) on one lane, from ``start`` for ``length``.

    ``label`` is the short text drawn on it, ``detail`` the longer one shown on hover;
    ``issued`` is False for a sync the backend left out (drawn hollow, no arrow): a drawing
    must not show a wait that never ran as one that did.
    """

    lane: str
    start: float
    length: float
    label: str
    kind: str = KERNEL
    detail: str = ""
    issued: bool = True

    @property
    def title(self) -> str:
        return self.detail or self.label


@dataclass(frozen=True)
class Arrow:
    """A dependency between lanes: the wait at ``end`` waits for the record at ``start``."""

    start_lane: str
    start: float
    end_lane: str
    end: float
    label: str = ""


@dataclass(frozen=True)
class Section:
    """A titled span of x (the forward, the backward)."""

    title: str
    start: float
    end: float


@dataclass
class Timeline:
    """Everything one drawing shows; ``unit`` names the x axis, ``caption`` says in full
    lines what x is and whether the syncs drawn ran (a reader cannot tell from the shapes)."""

    title: str
    unit: str
    lanes: list[str] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)
    arrows: list[Arrow] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)
    caption: list[str] = field(default_factory=list)

    def lane(self, name: str) -> str:
        """Add ``name`` as a lane (in first-use order) and return it."""
        if name not in self.lanes:
            self.lanes.append(name)
        return name

    @property
    def end(self) -> float:
        ends = [b.start + b.length for b in self.boxes] + [s.end for s in self.sections]
        return max(ends, default=1.0)

    def count(self, kind: str, *, issued: bool = True) -> int:
        """How many boxes of ``kind`` were issued (or, ``issued=False``, left out)."""
        return sum(1 for box in self.boxes if box.kind == kind and box.issued == issued)

    def left_out(self) -> int:
        """How many syncs are drawn that the compiled program does not issue."""
        return sum(1 for box in self.boxes if not box.issued)
