"""A carriage-return text progress bar on stderr (no dependency, redrawn at most 10x/s)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30
MIN_INTERVAL_S = 0.1


class ProgressBar:
    """``label [#####.....] 12/50  3.4 step/s``; ``close()`` ends the line."""

    def __init__(
        self, label: str, total: int, stream: TextIO | None = None, enabled: bool = True
    ) -> None:
        self.label = label
        self.total = max(total, 1)
        self.stream = sys.stderr if stream is None else stream
        self.enabled = enabled
        self.start = time.perf_counter()
        self._last_draw = 0.0
        self._draw(0, self.start)

    def update(self, done: int) -> None:
        """Redraw for ``done`` steps finished (skipped if the last redraw was too recent)."""
        now = time.perf_counter()
        if done < self.total and now - self._last_draw < MIN_INTERVAL_S:
            return
        self._draw(done, now)

    def _draw(self, done: int, now: float) -> None:
        if not self.enabled:
            return
        self._last_draw = now
        filled = WIDTH * done // self.total
        elapsed = now - self.start
        rate = f"{done / elapsed:6.1f} step/s" if elapsed > 0 and done else ""
        bar = "#" * filled + "." * (WIDTH - filled)
        self.stream.write(f"\r{self.label:<22} [{bar}] {done}/{self.total} {rate}")
        self.stream.flush()

    def close(self, note: str = "") -> None:
        if self.enabled:
            self.stream.write(f"  {note}\n" if note else "\n")
            self.stream.flush()
