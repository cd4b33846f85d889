"""Switch between native and package around a fresh Dynamo, leaving the install state as found."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch_userstreams.patch.install import session

from .timing import abba

MODES = (False, True)  # package? native first


def mode_name(package: bool) -> str:
    return "package" if package else "native"


def patched(package: bool) -> contextlib.AbstractContextManager[None]:
    """Fresh Dynamo, the package installed or not; the install state restored and Dynamo
    reset again on exit (the package's own ``session``, which the tests use too)."""
    return session(package)


def interleaved(repeats: int) -> Iterator[bool]:
    """Native and package alternately, order flipped each round (ABBA), so drift cancels."""
    for pair in abba(*MODES, repeats):
        yield from pair
