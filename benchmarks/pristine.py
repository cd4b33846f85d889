"""Child process for overhead (a): a graph compiled before the package was ever imported.

The parent's native graphs are compiled after an install()/uninstall(); this child compiles
(a) in a process that has never imported torch_userstreams, times it, then imports and
installs the package, compiles a fresh copy of (a) with it, and times the two compiled
functions in alternating short chunks (ABBA): machine noise, which comes in bursts, then
hits both sides of each pair alike. Prints one JSON line: every pair's per-call ns, and the
never-installed graph's fastest chunk from before the import.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import torch

from .timing import CHUNK_CALLS, abba, per_call_ns, warm_up
from .workloads import fresh_copy, stream_free

ARGS = (torch.ones(4),)


def _compiled_copy(calls: int) -> Any:
    """A fresh copy of (a) (its own code object, so its own compile), compiled and warm."""
    compiled = torch.compile(fresh_copy(stream_free), backend="eager")
    warm_up(compiled, ARGS, calls)
    return compiled


def measure(calls: int, repeats: int) -> dict[str, Any]:
    chunk = min(CHUNK_CALLS, calls)
    rounds = max(2, calls // chunk) * repeats
    never_installed = _compiled_copy(calls)
    before_import = min(per_call_ns(never_installed, ARGS, chunk) for _ in range(rounds))
    assert "torch_userstreams" not in sys.modules, "the never-installed run imported it"
    import torch_userstreams  # first import in this process

    torch_userstreams.install()
    try:
        package = _compiled_copy(calls)
        pairs = []
        for sides in abba(never_installed, package, rounds):
            ns = {id(fn): per_call_ns(fn, ARGS, chunk) for fn in sides}
            pairs.append((ns[id(never_installed)], ns[id(package)]))
    finally:
        torch_userstreams.uninstall()
    return {"pairs_ns": pairs, "never_installed_before_import_ns": before_import}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.calls, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
