"""The opt-in check of every graph a package backend compiles: ``TORCH_USERSTREAMS_CHECK``.

A racy function compiles and runs silently, and on CPU gives the right values. With
``TORCH_USERSTREAMS_CHECK=1`` (or ``raise``) each forward and backward graph with stream work
is judged by the static checker (``testing.check_stream_safety``) when it compiles, and a
hazard raises ``StreamHazardError`` naming the graph, the ops and their lines in the user's
code, and the fix; ``warn`` issues a ``StreamHazardWarning`` instead and compiles on. The
variable is read when a graph compiles: the per-call path pays nothing.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch.fx

from ..compile.table import UserObjectTable
from ..errors import StreamHazardError, StreamHazardWarning, UserStreamsError
from ..fx.meta import user_frame

VARIABLE = "TORCH_USERSTREAMS_CHECK"
_RAISE, _WARN, _OFF = ("1", "raise"), ("warn",), ("", "0", "off")


# Off while ``check()`` runs: it reports the hazards it finds instead of failing the compile.
_suspended: ContextVar[bool] = ContextVar("torch_userstreams.check_suspended", default=False)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    token = _suspended.set(True)
    try:
        yield
    finally:
        _suspended.reset(token)


def mode() -> str | None:
    """``"raise"``, ``"warn"``, or None (off), from the environment, checked for typos."""
    if _suspended.get():
        return None
    value = os.environ.get(VARIABLE, "").strip().lower()
    if value in _OFF:
        return None
    if value in _RAISE:
        return "raise"
    if value in _WARN:
        return "warn"
    raise UserStreamsError(
        f"torch_userstreams: {VARIABLE}={value!r} is not a setting; use 1 (or raise) to raise "
        "on a stream hazard when a graph compiles, warn to warn, or 0 to check nothing."
    )


def check_graph(gm: torch.fx.GraphModule, table: UserObjectTable | None, phase: str) -> None:
    """Judge ``gm`` (the ``phase`` graph of ``table``'s compile) when the check is on."""
    setting = mode()
    if setting is None or table is None:
        return
    # The static checker lives with the test helpers, which sit above the backends; it
    # imports nothing of theirs (``testing.capture``, which does, is not needed here).
    from ..testing.checker import STREAM_DEVICES_META, check_stream_safety

    devices = {e.index: str(e.device) for e in table.entries if e.device is not None}
    gm.meta[STREAM_DEVICES_META] = devices
    result = check_stream_safety(gm, current_streams=table.current_streams())
    if result:
        return
    lines = {node.name: _user_line(node) for node in gm.graph.nodes}
    found = []
    for finding in result.findings:
        at = ", ".join(
            f"{name} at {lines[name]}"
            for name in dict.fromkeys((finding.first, finding.second))
            if lines.get(name)
        )
        found.append(f"  {finding}" + (f"\n    at: {at}" if at else ""))
    message = (
        f"torch_userstreams: the {phase} graph of {table.graph_name} has "
        f"{len(result.findings)} stream hazard(s) ({VARIABLE}={setting}):\n" + "\n".join(found)
    )
    if setting == "raise":
        raise StreamHazardError(message)
    warnings.warn(message, StreamHazardWarning, stacklevel=2)


def _user_line(node: torch.fx.Node) -> str | None:
    """``file:line function`` of the user's code that made ``node``, if recorded."""
    frame = user_frame(node)
    return None if frame is None else frame[0]


def checked(compiler: Callable[..., Any], table: UserObjectTable, phase: str) -> Callable[..., Any]:
    """``compiler`` (an AOTAutograd graph compiler), judging each graph before it compiles."""

    def compile_checked(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        check_graph(gm, table, phase)
        return compiler(gm, example_inputs, **kwargs)

    return compile_checked
