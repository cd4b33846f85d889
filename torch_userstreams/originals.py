"""How a replacement of a torch function carries the function it replaces.

Every ``wrap_*`` factory of a patch point returns a function that calls the native one;
``carries(native)`` marks it with ``__wrapped__``, the attribute ``functools.wraps`` and
``inspect.unwrap`` use, without copying the native's name or module (Dynamo's trace rules
read those). ``patch.install`` checks the mark, so a factory that returns something else
fails the install instead of shadowing the native silently.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def carries(native: Callable[..., Any]) -> Callable[[F], F]:
    """Decorator: the decorated replacement carries ``native`` as its ``__wrapped__``."""

    def mark(replacement: F) -> F:
        replacement.__wrapped__ = native  # type: ignore[attr-defined]
        return replacement

    return mark


def original_of(replacement: Callable[..., Any]) -> Callable[..., Any] | None:
    """The function ``replacement`` carries, or None where it carries none."""
    return getattr(replacement, "__wrapped__", None)


_ABSENT = object()


@contextlib.contextmanager
def shadowed(owner: Any, replacements: dict[str, Any]) -> Iterator[None]:
    """``owner``'s attributes named in ``replacements`` set on the instance while entered,
    then as they were (an instance attribute restored, a class one shown again)."""
    before = {name: vars(owner).get(name, _ABSENT) for name in replacements}
    for name, value in replacements.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
