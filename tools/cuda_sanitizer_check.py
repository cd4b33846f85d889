"""Run generated stream programs on CUDA under the CUDA sanitizer, with and without the package.

    python tools/cuda_sanitizer_check.py REPORT.json|REPORT.md [--programs N] [--seed S]
        [--backends userstreams inductor]

The parent process generates N programs (``torch_userstreams.testing.strategies``) and
re-executes this script once per backend with ``TORCH_CUDA_SANITIZER=1`` (the sanitizer is
enabled when torch is imported, so it must be set before). Each child compiles and runs
every program (forward and backward), synchronizes, and records whether the sanitizer
reported a race ("hazard") or anything else failed ("error"). The report lists, per
backend, the programs run and what was found; it is JSON or markdown by the file suffix.

Backends: ``userstreams`` (Inductor with the package) and ``inductor`` (native, package
not installed) by default; ``userstreams_aot_eager`` and ``aot_eager`` also work. The
sanitizer sees aten ops only, so races inside Triton kernels are invisible to it; the
aot_eager-style backends run every op as an aten op.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

DEVICE = "cuda"
NATIVE = ("inductor", "aot_eager")


def generate(count: int, seed: int) -> list[str]:
    """``count`` program sources for CUDA, the same for the same seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from torch_userstreams.testing.strategies import programs

    sources: list[str] = []

    @hypothesis_seed(seed)
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(programs())
    def collect(program: Any) -> None:
        sources.append(program.source(eager=False, device=DEVICE))

    collect()
    return sources[:count]


def run_one(source: str, backend: str) -> dict[str, Any]:
    """Compile and run one program, forward and backward; classify what went wrong."""
    import torch

    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(source, "<program>", "exec"), namespace)
    program = namespace["program"]
    params = program.__code__.co_varnames[: program.__code__.co_argcount]
    x = torch.randn(4, device=DEVICE, requires_grad=True)
    w = torch.randn(4, device=DEVICE, requires_grad=True)
    streams = [torch.Stream(device=DEVICE) for _ in params[2:]]
    torch._dynamo.reset()
    started = time.perf_counter()
    try:
        out = torch.compile(program, backend=backend)(x, w, *streams)
        grads = [t.sum() for t in out if t.requires_grad]
        if grads:
            torch.stack(grads).sum().backward()
        torch.cuda.synchronize()
    except Exception as exc:
        raced = "CUDASanitizer" in type(exc).__name__ or "CSAN detected" in str(exc)
        kind = "hazard" if raced else "error"
        return {"status": kind, "detail": "".join(traceback.format_exception_only(exc))[-4000:]}
    return {"status": "ok", "seconds": round(time.perf_counter() - started, 3)}


def child(backend: str, programs_path: str, result_path: str) -> None:
    """Runs in a fresh process with the sanitizer on (set by the parent)."""
    import torch

    if backend not in NATIVE:
        import torch_userstreams

        torch_userstreams.install()
    sources = json.loads(Path(programs_path).read_text())
    results = [{"index": i, **run_one(source, backend)} for i, source in enumerate(sources)]
    summary = {"backend": backend, "torch": torch.__version__, "results": results}
    Path(result_path).write_text(json.dumps(summary, indent=1))


def run_backend(backend: str, programs_path: str, workdir: str) -> dict[str, Any]:
    result_path = os.path.join(workdir, f"{backend}.json")
    env = {**os.environ, "TORCH_CUDA_SANITIZER": "1"}
    command = [sys.executable, __file__, "--child", backend, programs_path, result_path]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not os.path.exists(result_path):
        return {"backend": backend, "crashed": done.returncode, "stderr": done.stderr[-4000:]}
    return json.loads(Path(result_path).read_text())  # type: ignore[no-any-return]


def markdown(report: dict[str, Any]) -> str:
    lines = [f"# CUDA sanitizer check: {report['programs']} programs, seed {report['seed']}", ""]
    for run in report["runs"]:
        lines.append(f"## {run['backend']} (torch {run.get('torch', '?')})")
        if "crashed" in run:
            lines += ["", f"child crashed (exit {run['crashed']}):", "```", run["stderr"], "```"]
            continue
        counts: dict[str, int] = {}
        for result in run["results"]:
            counts[result["status"]] = counts.get(result["status"], 0) + 1
        lines += ["", ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())), ""]
        for result in run["results"]:
            if result["status"] != "ok":
                lines += [f"### program {result['index']}: {result['status']}", "```"]
                lines += [result["detail"].rstrip(), "```", ""]
    lines += ["## programs", ""]
    for i, source in enumerate(report["sources"]):
        lines += [f"### program {i}", "```python", source.rstrip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(*argv[1:4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="output file: .json, or markdown otherwise")
    parser.add_argument("--programs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", nargs="+", default=["userstreams", "inductor"])
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("cuda_sanitizer_check: CUDA is not available on this machine; it needs a GPU.")
        return 2
    sources = generate(args.programs, args.seed)
    with tempfile.TemporaryDirectory() as workdir:
        programs_path = os.path.join(workdir, "programs.json")
        Path(programs_path).write_text(json.dumps(sources))
        runs = [run_backend(backend, programs_path, workdir) for backend in args.backends]
    report = {"programs": len(sources), "seed": args.seed, "runs": runs, "sources": sources}
    text = json.dumps(report, indent=1) if args.report.endswith(".json") else markdown(report)
    Path(args.report).write_text(text)
    print(f"cuda_sanitizer_check: {len(sources)} programs x {len(runs)} backends -> {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
