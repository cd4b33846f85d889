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


# The last compiled call's binding, from conftest's spy. Only one: the spy holds it strongly,
# and tests count live objects.
LAST_BINDING: list[Any] = []


def last_binding() -> Any:
    """The binding of the compiled call that last returned (on any thread)."""
    return LAST_BINDING[0] if LAST_BINDING else None


def forget_bindings() -> None:
    """Drop the spy's references, which would keep the calls' input streams alive."""
    LAST_BINDING.clear()


def backward_events(binding: Any) -> list[Any]:
    """The objects a call created for its backward (AOTAutograd's sync events)."""
    from torch_userstreams.runtime import graph_of, objects_of
    from torch_userstreams.table import Phase

    entries = graph_of(binding).table.entries
    return [objects_of(binding)[e.index] for e in entries if e.phase is Phase.BACKWARD]
