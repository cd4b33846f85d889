"""``torch.compile``'s ``mode`` and ``options`` for ``backend="userstreams"``.

Dynamo hands them to a named backend as keyword arguments; native Inductor turns them into
config patches for the forward and backward compiles. ``userstreams`` compiles with
Inductor too, so it takes them the same way, and refuses a mode or option Inductor does
not know with the name and the choices, before anything compiles.
"""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedPathError


def config_patches(mode: str | None, options: dict[str, Any] | None) -> dict[str, Any] | None:
    """Inductor config patches for ``mode`` then ``options`` (``options`` win), or None."""
    import torch._inductor
    import torch._inductor.config as inductor_config

    patches: dict[str, Any] = {}
    if mode is not None and mode != "default":
        modes = torch._inductor.list_mode_options()
        if mode not in modes:
            raise UnsupportedPathError(
                f"torch_userstreams: backend 'userstreams' got mode={mode!r}, which Inductor "
                f"does not know. Use one of {sorted(modes)}."
            )
        patches.update(modes[mode])
    if options:
        known = inductor_config.get_config_copy()
        unknown = sorted(key for key in options if key not in known)
        if unknown:
            raise UnsupportedPathError(
                f"torch_userstreams: backend 'userstreams' got options {unknown} that "
                "Inductor's config does not have (torch._inductor.config). Check the "
                "names, or pass them to torch.compile(backend='inductor') to compare."
            )
        patches.update(options)
    return patches or None
