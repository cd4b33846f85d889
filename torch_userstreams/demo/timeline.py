"""What a timeline drawing shows: lanes (one per stream), boxes, sync markers and arrows.

Two sources fill it: the stream schedule of the captured FX graphs (``schedule``, x is the
position in program order) and a CUDA profiler trace (``trace``, x is microseconds).
``render`` draws either the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

KERNEL = "kernel"
RECORD = "record"
WAIT = "wait"
SYNC = "sync"


@dataclass(frozen=True)
class Box:
    """Work (or a sync, drawn as a marker) on one lane, from ``start`` for ``length``."""

    lane: str
    start: float
    length: float
    label: str
    kind: str = KERNEL


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
    """Everything one drawing shows; ``unit`` names the x axis."""

    title: str
    unit: str
    lanes: list[str] = field(default_factory=list)
    boxes: list[Box] = field(default_factory=list)
    arrows: list[Arrow] = field(default_factory=list)
    sections: list[Section] = field(default_factory=list)

    def lane(self, name: str) -> str:
        """Add ``name`` as a lane (in first-use order) and return it."""
        if name not in self.lanes:
            self.lanes.append(name)
        return name

    @property
    def end(self) -> float:
        ends = [b.start + b.length for b in self.boxes] + [s.end for s in self.sections]
        return max(ends, default=1.0)

    def count(self, kind: str) -> int:
        return sum(1 for box in self.boxes if box.kind == kind)
