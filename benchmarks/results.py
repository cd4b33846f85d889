"""One ``Row`` per measurement, and the two ways they leave the process: a table and JSON."""

from __future__ import annotations

import datetime
import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

COLUMNS = ("benchmark", "case", "native", "package", "ratio/target")


@dataclass
class Row:
    """A measurement: native and package values in ``unit``; ``ok`` is None without a target."""

    benchmark: str
    case: str
    native: float | None
    package: float | None
    unit: str
    ratio: float | None = None  # package / native
    target: str = ""
    ok: bool | None = None
    skipped: bool = False
    details: dict[str, Any] = field(default_factory=dict)


def ratio_row(
    benchmark: str,
    case: str,
    native: float,
    package: float,
    unit: str,
    max_ratio: float | None = None,
    details: dict[str, Any] | None = None,
) -> Row:
    """A row whose verdict is package/native, checked against ``max_ratio`` when given."""
    ratio = package / native if native else None
    ok = None if max_ratio is None or ratio is None else ratio <= max_ratio
    target = "" if max_ratio is None else f"<= {max_ratio:g}x"
    return Row(benchmark, case, native, package, unit, ratio, target, ok, details=details or {})


def _value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "objects":
        return f"{value:+.0f}"
    return f"{value:.3f} {unit}" if abs(value) < 10 else f"{value:.1f} {unit}"


def _verdict(row: Row) -> str:
    parts = [] if row.ratio is None else [f"{row.ratio:.3f}x"]
    if row.target:
        parts.append(f"target {row.target}")
    if row.ok is not None:
        parts.append("ok" if row.ok else "MISSED")
    return " ".join(parts) or "-"


def table(rows: list[Row]) -> str:
    """A plain-text table, one row per measurement."""
    cells = [COLUMNS] + [
        (r.benchmark, r.case, _value(r.native, r.unit), _value(r.package, r.unit), _verdict(r))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(line.rstrip() for line in lines)


def environment() -> dict[str, str]:
    """Where the numbers come from; stored on every JSON row so rows stand alone."""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def to_dicts(rows: list[Row]) -> list[dict[str, Any]]:
    env = environment()
    return [{**asdict(r), **env} for r in rows]


def write_json(rows: list[Row], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_dicts(rows), indent=2) + "\n")
