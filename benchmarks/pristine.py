"""Child process for overhead (a): native timed *before* the package is ever imported.

The parent's native runs follow an install()/uninstall(); this one rules out anything an
install leaves behind. Package runs follow in the same child so the ratio never crosses
processes. Prints one JSON line: per-call ns samples for both.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from .timing import per_call_ns, warm_up
from .workloads import stream_free


def _sample(calls: int) -> float:
    torch._dynamo.reset()
    compiled = torch.compile(stream_free, backend="eager")
    args = (torch.ones(4),)
    warm_up(compiled, args, calls)
    return per_call_ns(compiled, args, calls)


def measure(calls: int, repeats: int) -> dict[str, list[float]]:
    never_installed = [_sample(calls) for _ in range(repeats)]
    assert "torch_userstreams" not in sys.modules, "the never-installed run imported it"
    from .modes import patched  # first import of torch_userstreams in this process

    package = []
    for _ in range(repeats):
        with patched(True):
            package.append(_sample(calls))
    return {"never_installed": never_installed, "package": package}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, required=True)
    parser.add_argument("--repeats", type=int, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.calls, args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
