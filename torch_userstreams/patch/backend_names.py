"""The package's backend names in Dynamo's registry while it is installed.

Dynamo loads a backend that an entry point names the first time a ``torch.compile`` call
names it, and registers it with no lock: threads that name it at once for the first time
each register it, and all but one fail with ``AssertionError: duplicate name``. So
``install()`` registers both names itself, and threads started after it never race.
``uninstall()`` removes the names it added: naming a backend then installs the package
again through its entry point, as before ``install()``.
"""

from __future__ import annotations

from typing import Any, cast


def register() -> list[str]:
    """Register each package backend Dynamo has not loaded yet; return the names added."""
    from torch._dynamo.backends import registry

    from ..backends import _BY_NAME

    added = []
    for name, backend in _BY_NAME.items():
        if name not in registry._COMPILER_FNS:
            registry._COMPILER_FNS[name] = cast(Any, backend)  # takes mode=/options= too
            added.append(name)
    return added


def unregister(names: list[str]) -> None:
    """Remove the names ``register`` added, where they still name the package's backend."""
    from torch._dynamo.backends import registry

    from ..backends import _BY_NAME

    for name in names:
        if registry._COMPILER_FNS.get(name) is _BY_NAME[name]:
            del registry._COMPILER_FNS[name]
