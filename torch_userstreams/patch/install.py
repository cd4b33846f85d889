"""Install and uninstall the patches: all-or-nothing, idempotent, thread-safe, exact undo.

``install()`` first resolves and checks every patch point of the running torch version and
finds every by-value alias; only when all of that succeeded does it write anything. Each
write is recorded as (owner, attribute, original raw value), so ``uninstall()`` restores
the identical objects, staticmethod descriptors included.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import logging
import re
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import PatchPointError, UnsupportedTorchError
from ..originals import original_of
from ..run import native
from ..run.own_ops import no_effect_fake
from ..run.state import forget_thread_state, wait_for_calls_on_other_threads
from . import fakes
from .points import (
    LAZY_MODULES,
    POINTS,
    SUPPORTED_MINORS,
    SUPPORTED_RANGE,
    PatchPoint,
    minor_of,
)

log = logging.getLogger("torch_userstreams")

STREAMS_MODULE = "torch._dynamo.variables.streams"
_PRERELEASE = re.compile(r"(dev|a\d|b\d|rc\d|git)")


@dataclass(frozen=True)
class Site:
    """One attribute slot we overwrite."""

    owner: Any  # a module or a class
    attr: str
    original: Any  # the raw value in owner.__dict__ (a staticmethod stays a staticmethod)
    point: PatchPoint

    @property
    def where(self) -> str:
        owner = getattr(self.owner, "__module__", None)
        name = (
            getattr(self.owner, "__qualname__", None)
            or getattr(self.owner, "__name__", None)
            or repr(self.owner)
        )
        return (
            f"{owner}.{name}.{self.attr}"
            if owner and inspect.isclass(self.owner)
            else f"{name}.{self.attr}"
        )


@dataclass(frozen=True)
class Resolved:
    point: PatchPoint
    owner: Any
    attr: str
    raw: Any  # owner.__dict__[attr]
    native: Any  # the callable behind it


_lock = threading.RLock()
_applied: list[tuple[Site, Any]] = []


def supported_minor(version: str | None = None) -> str:
    """The minor version key of a supported torch, or raise ``UnsupportedTorchError``."""
    version = version or torch.__version__
    minor = minor_of(version)
    public = version.split("+")[0]
    if minor not in SUPPORTED_MINORS or _PRERELEASE.search(public):
        raise UnsupportedTorchError(
            f"torch_userstreams supports torch {SUPPORTED_RANGE} releases "
            f"({', '.join(SUPPORTED_MINORS)}); this is torch {version}. Nothing was patched. "
            "Install a supported release (for example `pip install torch==2.13.0`) or use "
            "torch.compile without torch_userstreams."
        )
    return minor


def import_lazy_modules(minor: str) -> None:
    """Import the modules torch loads lazily, so an identity scan sees every alias."""
    for name in LAZY_MODULES[minor]:
        importlib.import_module(name)


def resolve(point: PatchPoint) -> Resolved:
    """Find one patch point and check it still looks as we expect."""
    try:
        owner: Any = importlib.import_module(point.module)
    except ImportError as exc:
        raise _missing(point, f"module {point.module} cannot be imported ({exc})") from exc
    *path, attr = point.qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            raise _missing(point, f"{part} is gone from {point.module}")
    raw = vars(owner).get(attr)
    if raw is None:
        raise _missing(point, f"{attr} is gone")
    native = raw.__func__ if isinstance(raw, staticmethod) else raw
    if point.static != isinstance(raw, staticmethod) or not callable(native):
        raise _missing(point, f"it is a {type(raw).__name__}, not the expected function")
    params = tuple(inspect.signature(native).parameters)
    if params != point.params:
        raise _missing(point, f"its parameters are {params}, expected {point.params}")
    _check_uses(point, owner, attr, native)
    return Resolved(point, owner, attr, raw, native)


def _check_uses(point: PatchPoint, owner: Any, attr: str, native: Any) -> None:
    """What else the patch relies on: the handler table that holds the native, the names
    its replacement uses."""
    if point.table is not None:
        entry = vars(owner).get(point.table, {}).get(attr)
        if getattr(entry, "handler", None) is not native:
            raise _missing(point, f"{point.table}[{attr!r}] no longer holds it")
    module = importlib.import_module(point.module)
    for name in point.needs:
        if not hasattr(module, name):
            raise _missing(point, f"{point.module}.{name}, which its replacement uses, is gone")


def _missing(point: PatchPoint, what: str) -> PatchPointError:
    return PatchPointError(
        f"torch_userstreams cannot patch torch {torch.__version__}: patch point "
        f"{point.name} is missing or changed: {what}. Supported torch: {SUPPORTED_RANGE}. "
        "Nothing was patched. Use a supported torch release, or update "
        "torch_userstreams/patch/points.py for this version (see CONTRIBUTING.md)."
    )


def _torch_modules() -> Iterator[Any]:
    for name, module in list(sys.modules.items()):
        if module is not None and (name == "torch" or name.startswith("torch.")):
            yield module


def find_aliases(native: Any) -> list[tuple[Any, str]]:
    """Every (module, attribute) of a loaded torch module that holds ``native`` itself."""
    found: list[tuple[Any, str]] = []
    for module in _torch_modules():
        try:
            items = list(vars(module).items())
        except TypeError:
            continue
        found.extend((module, attr) for attr, value in items if value is native)
    return found


def _replacement_for(resolved: Resolved) -> Any:
    replacement = resolved.point.replacement
    if resolved.point.wraps:
        replacement = replacement(resolved.native)
        if original_of(replacement) is not resolved.native:
            factory = resolved.point.replacement.__qualname__
            raise PatchPointError(
                f"torch_userstreams: patch point {resolved.point.name}: its factory "
                f"{factory} returned a function that does not carry the native it wraps. "
                f"Nothing was patched. Decorate the function {factory} returns with "
                "torch_userstreams.originals.carries(native)."
            )
    return staticmethod(replacement) if resolved.point.static else replacement


def plan(minor: str) -> list[tuple[Site, Any]]:
    """Every (site, new value) to write, computed without writing anything."""
    import_lazy_modules(minor)
    writes: list[tuple[Site, Any]] = []
    # One copy of each handler table, holding every patched entry of that table.
    tables: dict[tuple[Any, str], dict[str, Any]] = {}
    for point in POINTS[minor]:
        resolved = resolve(point)
        new = _replacement_for(resolved)
        writes.append((Site(resolved.owner, resolved.attr, resolved.raw, point), new))
        if point.table is not None:
            key = (resolved.owner, point.table)
            if key not in tables:
                site, tables[key] = _table_copy(resolved)
                writes.append((site, tables[key]))
            tables[key][resolved.attr] = _table_entry(resolved, new)
        if point.aliases:
            for module, attr in find_aliases(resolved.native):
                if module is resolved.owner and attr == resolved.attr:
                    continue
                writes.append((Site(module, attr, vars(module)[attr], point), new))
    writes.extend(_fake_impl_writes())
    return writes


def _table_copy(resolved: Resolved) -> tuple[Site, dict[str, Any]]:
    """A copy of the class's handler table, which install writes to the class with the
    patched entries in it; the site keeps the original for ``uninstall()``."""
    table_attr = resolved.point.table
    assert table_attr is not None
    table = vars(resolved.owner)[table_attr]
    return Site(resolved.owner, table_attr, table, resolved.point), dict(table)


def _table_entry(resolved: Resolved, new: Any) -> Any:
    """The table's entry for the patched method, wrapping ``new`` (the entry's own type, so
    Dynamo calls it as it called the native one)."""
    table_attr = resolved.point.table
    assert table_attr is not None
    entry = vars(resolved.owner)[table_attr][resolved.attr]
    return type(entry)(new)


def _fake_impl_writes() -> list[tuple[Site, Any]]:
    """Fake implementations for the ``streams`` ops whose native one fails (``fakes``)."""
    writes = []
    for opdef, attr, original, new in fakes.fake_impl_writes():
        point = PatchPoint(
            STREAMS_MODULE, f"{opdef._name}.{attr}", no_effect_fake, (), aliases=False
        )
        writes.append((Site(opdef, attr, original, point), new))
    return writes


@contextlib.contextmanager
def _between_compiles() -> Iterator[None]:
    """Hold Dynamo's compile lock: a compile in flight on another thread finishes first, on
    the mechanism it started with, and no compile starts until the patches are all written
    (or all restored). Re-entrant, so a backend may install while it compiles."""
    from torch._dynamo.convert_frame import compile_lock

    with compile_lock, _lock:
        yield


def install() -> None:
    """Patch torch.compile's user-object layer. Idempotent; raises and patches nothing on error."""
    with _between_compiles():
        if _applied:
            return
        minor = supported_minor()
        writes = plan(minor)
        done: list[tuple[Site, Any]] = []
        try:
            for site, new in writes:
                setattr(site.owner, site.attr, new)
                done.append((site, new))
        except BaseException:
            _restore(done)
            raise
        _applied.extend(done)
        native.set_fill_native_table(False)


def _restore(done: list[tuple[Site, Any]]) -> None:
    for site, _ in reversed(done):
        setattr(site.owner, site.attr, site.original)


def uninstall() -> None:
    """Restore every patched attribute to the identical object it replaced."""
    with _between_compiles():
        # Calls starting from now fill native's table as well; calls already running on
        # other threads finish on the package's lookup before it is unpatched.
        native.set_fill_native_table(True)
        if not wait_for_calls_on_other_threads():
            log.warning(
                "torch_userstreams: uninstall() went ahead while a compiled call on another "
                "thread was still running after 10 s; that call's user objects may not resolve"
            )
        _restore(_applied)
        _applied.clear()
        forget_thread_state()


# The ``installed()`` blocks open in any thread, and whether the first of them installed.
_blocks_lock = threading.Lock()
_open_blocks = 0
_blocks_installed = False


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """Install for the duration of the block; leave it as it was found afterwards.

    Blocks may overlap across threads (``explain()`` and ``testing.capture()`` open one):
    the package stays installed until the last open block ends, and is uninstalled then
    only if it was not installed when the first of them began."""
    global _open_blocks, _blocks_installed
    with _blocks_lock:
        if _open_blocks == 0:
            _blocks_installed = not is_installed()
        install()
        _open_blocks += 1
    try:
        yield
    finally:
        with _blocks_lock:
            _open_blocks -= 1
            if _open_blocks == 0 and _blocks_installed:
                uninstall()


@contextlib.contextmanager
def session(package: bool = True) -> Iterator[None]:
    """A fresh Dynamo, the package installed (or not) for the block; afterwards the install
    state found and a fresh Dynamo again, whatever the block compiled."""
    import torch

    was_installed = is_installed()
    torch._dynamo.reset()
    try:
        if package:
            install()
        else:
            uninstall()
        yield
    finally:
        torch._dynamo.reset()
        (install if was_installed else uninstall)()


def is_installed() -> bool:
    """Whether the package's patches are in place now (by ``install()`` or an open
    ``installed()`` block)."""
    return bool(_applied)


def applied_sites() -> list[tuple[Site, Any]]:
    """The writes currently in effect, each with the original it replaced (for tests)."""
    with _lock:
        return list(_applied)
