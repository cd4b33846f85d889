"""Switch between native and package, always leaving the process unpatched."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

import torch_userstreams

from .timing import abba

MODES = (False, True)  # package? native first


def mode_name(package: bool) -> str:
    return "package" if package else "native"


@contextlib.contextmanager
def patched(package: bool) -> Iterator[None]:
    """Fresh Dynamo, the package installed or not; uninstalled and reset again on exit."""
    torch._dynamo.reset()
    try:
        if package:
            torch_userstreams.install()
        else:
            torch_userstreams.uninstall()
        yield
    finally:
        torch_userstreams.uninstall()
        torch._dynamo.reset()


def interleaved(repeats: int) -> Iterator[bool]:
    """Native and package alternately, order flipped each round (ABBA), so drift cancels."""
    for pair in abba(*MODES, repeats):
        yield from pair
