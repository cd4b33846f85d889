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

# The package's own option: compile each graph with streams as one call (True, the default)
# or as regions (False).
ONE_CALL_OPTION = "userstreams.one_call"


def package_options(options: dict[str, Any] | None) -> tuple[bool, dict[str, Any] | None]:
    """Whether ``options`` leaves one compiled call per graph on (the default), and the
    options left for Inductor (``options`` as given where it is not a dict:
    ``config_patches`` refuses it)."""
    if not isinstance(options, dict) or ONE_CALL_OPTION not in options:
        return True, options
    one_call = options[ONE_CALL_OPTION]
    if not isinstance(one_call, bool):
        raise UnsupportedPathError(
            f"torch_userstreams: option {ONE_CALL_OPTION!r} is True or False, got "
            f"{one_call!r}: True (the default) compiles each graph with streams as one "
            f"Inductor call, options={{{ONE_CALL_OPTION!r}: False}} as regions."
        )
    return one_call, {key: value for key, value in options.items() if key != ONE_CALL_OPTION}


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
        if not isinstance(options, dict) or not all(type(key) is str for key in options):
            raise UnsupportedPathError(
                f"torch_userstreams: backend {backend!r} got options={options!r}; options is "
                "a dict of Inductor config names to values, e.g. "
                "options={'triton.cudagraphs': False}."
            )
        known = inductor_config.get_config_copy()
        unknown = sorted(key for key in options if key not in known)
        if unknown:
            hint = _did_you_mean(unknown, known)
            raise UnsupportedPathError(
                f"torch_userstreams: backend {backend!r} got options {unknown} that "
                f"Inductor's config does not have (torch._inductor.config){hint}. Check the "
                "names, or pass them to torch.compile(backend='inductor') to compare."
            )
        patches.update(options)
    return patches or None


def _did_you_mean(unknown: list[str], known: dict[str, Any]) -> str:
    """``: did you mean 'a' for 'b'?`` for the unknown names with a close known one."""
    import difflib

    close = {
        name: found[0]
        for name in unknown
        if (found := difflib.get_close_matches(name, known, n=1, cutoff=0.75))
    }
    if not close:
        return ""
    return ": did you mean " + ", ".join(f"{m!r} for {n!r}" for n, m in close.items()) + "?"


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
