"""``torch.compile``'s ``mode`` and ``options`` for the package's backends.

Dynamo hands them to a named backend as keyword arguments; native Inductor turns them into
config patches for the forward and backward compiles. ``userstreams`` compiles with
Inductor too, so it takes them the same way, and refuses a mode or option Inductor does
not know with the name and the choices, before anything compiles. ``userstreams_aot_eager``
runs no Inductor: it checks the names the same way (a typo stays a typo when a user
switches backends to debug) and warns that it ignores them, as ``aot_eager`` logs.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..errors import UnsupportedPathError


def config_patches(
    mode: str | None, options: dict[str, Any] | None, *, backend: str = "userstreams"
) -> dict[str, Any] | None:
    """Inductor config patches for ``mode`` then ``options`` (``options`` win), or None."""
    import torch._inductor
    import torch._inductor.config as inductor_config

    patches: dict[str, Any] = {}
    if mode is not None and mode != "default":
        modes = torch._inductor.list_mode_options()
        if mode not in modes:
            raise UnsupportedPathError(
                f"torch_userstreams: backend {backend!r} got mode={mode!r}, which Inductor "
                f"does not know. Use one of {sorted(modes)}."
            )
        patches.update(modes[mode])
    if options:
        known = inductor_config.get_config_copy()
        unknown = sorted(key for key in options if key not in known)
        if unknown:
            raise UnsupportedPathError(
                f"torch_userstreams: backend {backend!r} got options {unknown} that "
                "Inductor's config does not have (torch._inductor.config). Check the "
                "names, or pass them to torch.compile(backend='inductor') to compare."
            )
        patches.update(options)
    return patches or None


def warn_ignored(mode: str | None, options: dict[str, Any] | None) -> None:
    """``userstreams_aot_eager`` got Inductor settings: refuse unknown names, warn of the
    rest, which configure a compiler this backend does not run."""
    if config_patches(mode, options, backend="userstreams_aot_eager") is None:
        return
    given = ([f"mode={mode!r}"] if mode not in (None, "default") else []) + sorted(options or {})
    warnings.warn(
        f"torch_userstreams: backend 'userstreams_aot_eager' ignores {', '.join(given)}: "
        "they configure Inductor, which this debugging backend does not run. "
        "backend='userstreams' applies them.",
        stacklevel=2,
    )
