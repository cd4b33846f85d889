"""A text progress bar on stderr (no dependency): redrawn in place on a terminal, at most
10x/s; one line when the run ends everywhere else (a log file gets no carriage returns)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30
MIN_INTERVAL_S = 0.1


class ProgressBar:
    """``label [#####.....] 12/50  3.4 step/s``; ``close()`` ends the line.

    The rate counts the steps after the first: a compiled run's first step compiles (seconds),
    and a rate over it says nothing of the steps after. ``first_note`` is shown until the
    first step ends ("compiling")."""

    def __init__(
        self,
        label: str,
        total: int,
        stream: TextIO | None = None,
        enabled: bool = True,
        first_note: str = "",
    ) -> None:
        self.label = label
        self.total = max(total, 1)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.live = enabled and _is_terminal(self.stream)
        self.first_note = first_note
        self.start = time.perf_counter()
        self.first_end: float | None = None
        self.done = 0
        self._last_draw = 0.0
        self._draw(0, self.start)

    def update(self, done: int) -> None:
        """Redraw for ``done`` steps finished (skipped if the last redraw was too recent)."""
        now = time.perf_counter()
        self.done = done
        if done >= 1 and self.first_end is None:
            self.first_end = now
            self._draw(done, now)
            return
        if done < self.total and now - self._last_draw < MIN_INTERVAL_S:
            return
        self._draw(done, now)

    def line(self, done: int, now: float) -> str:
        """What the bar shows after ``done`` steps, at ``now``."""
        filled = WIDTH * done // self.total
        bar = "#" * filled + "." * (WIDTH - filled)
        return f"{self.label:<22} [{bar}] {done}/{self.total} {self._rate(done, now)}".rstrip()

    def _rate(self, done: int, now: float) -> str:
        if self.first_end is None:
            return f"({self.first_note})" if self.first_note else ""
        first = f"first step {self.first_end - self.start:.1f} s"
        after = now - self.first_end
        if done < 2 or after <= 0:
            return first
        return f"{(done - 1) / after:8.1f} step/s after the first ({first})"

    def _draw(self, done: int, now: float) -> None:
        if not self.live:
            return
        self._last_draw = now
        self.stream.write("\r" + self.line(done, now) + "\x1b[K")
        self.stream.flush()

    def close(self, note: str = "") -> None:
        if not self.enabled:
            return
        if not self.live:
            self.stream.write(self.line(self.done, time.perf_counter()))
        self.stream.write(f"  {note}\n" if note else "\n")
        self.stream.flush()


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())
