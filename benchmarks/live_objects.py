"""Live torch.Stream/torch.Event objects after N calls of (b), package vs native.

Native Dynamo appends every graph-created object to ``graph_bytecode_inputs.keep_alive``
for the life of the process (+2 per call of (b)); the package binds objects per call, so
the count must stay flat.
"""

from __future__ import annotations

import torch

from torch_userstreams.testing.objects import live_user_objects

from .config import Config
from .modes import MODES, mode_name, patched
from .results import Row
from .workloads import creates_two

BENCH = "live_objects"
SETTLE_CALLS = 3  # compile, and let any one-time objects appear before the baseline


def growth(package: bool, calls: int) -> tuple[int, int]:
    """(live before, live after) ``calls`` calls of a compiled (b), once it has settled."""
    with patched(package):
        compiled = torch.compile(creates_two, backend="eager")
        x = torch.ones(4)
        for _ in range(SETTLE_CALLS):
            compiled(x)
        before = live_user_objects()
        for _ in range(calls):
            compiled(x)
        after = live_user_objects()
        del compiled
    return before, after


def run(config: Config) -> list[Row]:
    counts = {mode_name(p): growth(p, config.calls) for p in MODES}
    native, package = (after - before for before, after in counts.values())
    details = {"calls": config.calls, **{f"{m}_before_after": c for m, c in counts.items()}}
    return [
        Row(
            BENCH,
            f"b: growth over {config.calls} calls",
            native,
            package,
            "objects",
            target="package +0",
            ok=package == 0,
            details=details,
        ),
        Row(
            BENCH,
            "b: growth per call",
            native / config.calls,
            package / config.calls,
            "objects/call",
        ),
    ]
