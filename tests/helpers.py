"""Test helpers shared by several test modules."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import torch


def live_user_objects() -> int:
    """How many torch.Stream/torch.Event objects are alive (reachable from tracked objects).

    Plain torch.Stream objects are not tracked by the gc, so count the referents of every
    tracked object, by identity.
    """
    gc.collect()
    kinds = (torch.Stream, torch.Event)
    seen: set[int] = set()
    for obj in gc.get_objects():
        if issubclass(type(obj), kinds):
            seen.add(id(obj))
        for ref in gc.get_referents(obj):
            if issubclass(type(ref), kinds):
                seen.add(id(ref))
    return len(seen)


def run_threads(worker: Callable[[int], None], count: int) -> None:
    """Run ``worker(i)`` on ``count`` threads at once and wait for all of them."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


LAST_BINDING: list[Any] = [None]  # filled by the ``spy_bindings`` fixture in conftest.py


def last_binding() -> Any:
    """The binding of the compiled call that last returned (on any thread)."""
    return LAST_BINDING[0]


def backward_events(binding: Any) -> list[Any]:
    """The objects a call created for its backward (AOTAutograd's sync events)."""
    from torch_userstreams.table import Phase

    entries = binding.graph.table.entries
    return [binding.objects[e.index] for e in entries if e.phase is Phase.BACKWARD]
