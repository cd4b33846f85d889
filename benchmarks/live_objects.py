"""Live torch.Stream/torch.Event objects after N calls of (b), package vs native.

Native Dynamo appends every graph-created object to ``graph_bytecode_inputs.keep_alive``
for the life of the process (+2 per call of (b)); the package binds objects per call, so
the count must stay flat.
"""

from __future__ import annotations

import gc
import warnings

import torch

from .config import Config
from .modes import MODES, mode_name, patched
from .results import Row
from .workloads import creates_two

BENCH = "live_objects"
SETTLE_CALLS = 3  # compile, and let any one-time objects appear before the baseline


def _is_user_object(obj: object) -> bool:
    return isinstance(obj, (torch.Stream, torch.Event))


def count_live() -> int:
    """Streams/events reachable from any gc-tracked object, counted once each by id.

    Plain torch.Stream objects are not gc-tracked, so referents of tracked objects are
    scanned too. isinstance() on some torch module proxies warns; that is noise here.
    """
    gc.collect()
    seen: set[int] = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            if _is_user_object(obj):
                seen.add(id(obj))
            seen.update(id(ref) for ref in gc.get_referents(obj) if _is_user_object(ref))
    return len(seen)


def growth(package: bool, calls: int) -> tuple[int, int]:
    """(live before, live after) ``calls`` calls of a compiled (b), once it has settled."""
    with patched(package):
        compiled = torch.compile(creates_two, backend="eager")
        x = torch.ones(4)
        for _ in range(SETTLE_CALLS):
            compiled(x)
        before = count_live()
        for _ in range(calls):
            compiled(x)
        after = count_live()
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
