"""``python -m torch_userstreams doctor``: can this environment be patched, and why not.

Reads only: it resolves every patch point of the running torch and counts the by-value
aliases ``install()`` would also patch, but it writes nothing. So a user can run it before
``install()`` to see, in one screen, what would fail and where.
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass
from typing import TextIO

import torch

from .errors import PatchPointError, UnsupportedTorchError
from .patch import install as patching
from .patch.points import POINTS, SUPPORTED_MINORS, SUPPORTED_RANGE, PatchPoint, minor_of

_REASON = re.compile(r"is missing or changed: (.*)\. Supported torch:", re.S)


@dataclass(frozen=True)
class PointReport:
    """The outcome for one patch point: found (with its alias count) or why not."""

    point: PatchPoint
    found: bool
    detail: str  # "(3 aliases)" / "(in place)" when found, the reason when not


def _accelerator() -> str:
    """The current accelerator's device type, or ``none``; never fails the report."""
    try:
        device = torch.accelerator.current_accelerator()
    except Exception as exc:  # a broken driver install should still get a report
        return f"unknown ({type(exc).__name__}: {exc})"
    return device.type if device is not None else "none"


def _reason(exc: PatchPointError) -> str:
    """The short cause inside a PatchPointError, without its advice text."""
    match = _REASON.search(str(exc))
    return match.group(1) if match else str(exc)


def check_point(point: PatchPoint) -> PointReport:
    """Resolve one point and count the other slots holding the same native object."""
    try:
        resolved = patching.resolve(point)
    except PatchPointError as exc:
        return PointReport(point, False, _reason(exc))
    if not point.aliases:
        return PointReport(point, True, "(in place)")
    aliases = [
        (module, attr)
        for module, attr in patching.find_aliases(resolved.native)
        if not (module is resolved.owner and attr == resolved.attr)
    ]
    noun = "alias" if len(aliases) == 1 else "aliases"
    return PointReport(point, True, f"({len(aliases)} {noun})")


def _version_line(out: TextIO) -> str | None:
    """Print the torch line; return the supported minor, or None when unsupported."""
    try:
        minor: str | None = patching.supported_minor()
        status = f"supported (patch points for {minor})"
    except UnsupportedTorchError:
        minor = None
        status = f"not supported (supported: {SUPPORTED_RANGE} releases)"
    _field(out, "torch", f"{torch.__version__}  {status}")
    return minor


def _field(out: TextIO, key: str, value: str) -> None:
    print(f"  {key:<12} {value}", file=out)


def _check_points(minor: str, out: TextIO) -> bool:
    """Print one aligned line per point of ``minor``; True when every one was found."""
    try:
        patching.import_lazy_modules(minor)
    except ImportError as exc:
        print(f"  cannot import a module torch loads lazily: {exc}", file=out)
        return False
    reports = [check_point(point) for point in POINTS[minor]]
    width = max(len(report.point.name) for report in reports)
    print(f"patch points for torch {minor} ({len(reports)}):", file=out)
    for report in reports:
        status = "found" if report.found else "missing"
        print(f"  {status:<7}  {report.point.name:<{width}}  {report.detail}", file=out)
    found = sum(report.found for report in reports)
    print(f"  {found} of {len(reports)} found", file=out)
    return found == len(reports)


def run(out: TextIO) -> int:
    """Print the report; 0 when torch is supported and every patch point was found."""
    print("torch_userstreams doctor (reads only, patches nothing)", file=out)
    supported = _version_line(out)
    _field(out, "python", platform.python_version())
    _field(out, "accelerator", _accelerator())
    _field(
        out,
        "installed",
        "yes (results describe the patched state)" if patching.is_installed() else "no",
    )
    # An unsupported release of a known minor (a dev build) still gets its points checked.
    minor = supported or minor_of(torch.__version__)
    if minor in POINTS:
        all_found = _check_points(minor, out)
    else:
        print(
            f"no patch points registered for torch {minor} (known: {', '.join(SUPPORTED_MINORS)})",
            file=out,
        )
        all_found = False
    ok = supported is not None and all_found
    if ok:
        verdict = "OK: install() can patch this torch"
    elif supported is None:
        verdict = f"FAIL: torch {torch.__version__} is not supported ({SUPPORTED_RANGE})"
    else:
        verdict = "FAIL: install() would raise PatchPointError (see missing points above)"
    print(verdict, file=out)
    return 0 if ok else 1
