"""Counting live ``torch.Stream`` / ``torch.Event`` objects: the one counter that tests, the
demo and the benchmarks share, so a leak reads the same everywhere."""

from __future__ import annotations

import gc

import torch

CHUNK = 4096


def _user_object_types() -> frozenset[type]:
    """torch.Stream, torch.Event and every subclass defined so far (SimStream, cuda.Event...)."""
    found: set[type] = set()
    todo: list[type] = [torch.Stream, torch.Event]
    while todo:
        cls = todo.pop()
        if cls not in found:
            found.add(cls)
            todo.extend(cls.__subclasses__())
    return frozenset(found)


def live_user_objects() -> int:
    """Streams/events reachable from any gc-tracked object, counted once each by id.

    Plain ``torch.Stream`` objects are not tracked by the gc, so the referents of every
    tracked object are scanned too. A process that has compiled
    holds millions of objects: chunks are first checked with C-level set operations over
    their types, and only the rare chunk holding a user object is scanned in Python.
    """
    gc.collect()
    kinds = _user_object_types()
    seen: set[int] = set()
    objects = gc.get_objects()
    for i in range(0, len(objects), CHUNK):
        chunk = objects[i : i + CHUNK]
        referents = gc.get_referents(*chunk)
        if kinds.isdisjoint(map(type, chunk)) and kinds.isdisjoint(map(type, referents)):
            continue
        seen.update(id(obj) for obj in chunk if type(obj) in kinds)
        seen.update(id(ref) for ref in referents if type(ref) in kinds)
    return len(seen)
