"""Who asked for an object: the first caller outside this package, named for ``explain()``."""

from __future__ import annotations

import sys

from .table import Phase

# AOTAutograd's stream passes that request objects only the backward graph reads.
_BACKWARD_PASSES = frozenset(
    {"insert_backward_syncs", "sync_deallocations", "assign_backward_streams"}
)
_OWN_PREFIX = __name__.rsplit(".", 1)[0] + "."
_OWN_PASSES = _OWN_PREFIX + "passes."


def _is_plumbing(module: str) -> bool:
    """Our own frames, except our passes: they are the requesters worth naming."""
    return module.startswith(_OWN_PREFIX) and not module.startswith(_OWN_PASSES)


def caller() -> tuple[str, Phase]:
    """(``module.function`` of the requester, the phase its request is for)."""
    frame = sys._getframe(1)
    while frame is not None and (
        _is_plumbing(frame.f_globals.get("__name__", ""))
        or frame.f_code.co_name in ("new_stream", "new_event", "get_current_stream")
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return "<unknown>", Phase.FORWARD
    name = frame.f_code.co_name
    module = frame.f_globals.get("__name__", "?")
    phase = Phase.BACKWARD if name in _BACKWARD_PASSES else Phase.FORWARD
    return f"{module}.{name}", phase
