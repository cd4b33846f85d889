"""What a ``plan.Program`` is made of: steps, and references to the values they make.

Its own module so that the program (``plan``) and the function written from it
(``launcher``) both read it without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ref:
    """Stands for the value in ``slot`` inside an argument template."""

    slot: int


@dataclass(frozen=True)
class Step:
    """Call ``call(*args, **kwargs)`` on ``stream`` (None: as is); store the result in
    ``output`` (a slot), or unpack it into ``outputs``; then drop the slots in ``frees``.

    A ``boxed`` call takes its arguments as one list it owns (Inductor's compiled graphs);
    ``direct``, if given, is the same computation without the caller's per-call bookkeeping
    (an Inductor graph's generated ``call``), which the launcher uses once nobody watches.
    """

    call: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    stream: int | None = None
    output: int | None = None
    outputs: tuple[int, ...] = ()
    frees: tuple[int, ...] = ()
    boxed: bool = False
    direct: Callable[..., Any] | None = None
