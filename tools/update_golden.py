"""Write the running torch's patch-point signatures into ``tests/golden/signatures.json``.

Usage, once per torch release (in a venv that has it): ``python tools/update_golden.py
[PATH]``. Only the entry of the running minor version is replaced; the others are kept, so
``tests/test_patching.py::test_golden_signatures_of_patched_internals`` pins every version.
Review the result with ``git diff`` before committing.
"""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

import torch

from torch_userstreams.patch import install as patching
from torch_userstreams.patch.points import POINTS, minor_of

DEFAULT = Path(__file__).resolve().parents[1] / "tests" / "golden" / "signatures.json"


def signatures(minor: str) -> dict[str, str]:
    """``{point name: signature}`` of every patch point of ``minor``, as torch has them."""
    return {
        point.name: str(inspect.signature(patching.resolve(point).native))
        for point in POINTS[minor]
    }


def main(argv: list[str]) -> int:
    """Replace the running minor's entry in the golden file (default: the tests' one)."""
    path = Path(argv[0]) if argv else DEFAULT
    minor = minor_of(torch.__version__)
    if minor not in POINTS:
        print(
            f"torch {torch.__version__}: no patch points for {minor}; add them to "
            "torch_userstreams/patch/points.py first",
            file=sys.stderr,
        )
        return 1
    data = json.loads(path.read_text()) if path.exists() else {}
    data[minor] = signatures(minor)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"{minor} written to {path} ({len(data[minor])} signatures, torch {torch.__version__})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
