"""Testing tools for stream programs: a hazard checker, graph capture and program generators.

* ``check_stream_safety(gm)`` / ``assert_stream_safe(gm)``: static happens-before check of
  an FX graph (``checker``).
* ``capture(fn, *args)``: the graphs a package backend executes for ``fn`` (``capture``).
* ``races.detect_races()``: a run-time race detector over simulated streams, with
  ``fake_accelerator.fake_accelerator(gpu_semantics=True)`` for what a GPU would race on.
* ``strategies``: Hypothesis strategies of stream programs (needs ``hypothesis``; import it
  explicitly).
"""

from __future__ import annotations

from .capture import Capture, capture
from .checker import CURRENT_STREAMS_META, SafetyResult, assert_stream_safe, check_stream_safety
from .hazards import Finding, HazardKind

__all__ = [
    "CURRENT_STREAMS_META",
    "Capture",
    "Finding",
    "HazardKind",
    "SafetyResult",
    "assert_stream_safe",
    "capture",
    "check_stream_safety",
]
