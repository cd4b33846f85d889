"""Run generated stream programs on CUDA under the CUDA sanitizer: eager first, then compiled.

    python tools/cuda_sanitizer_check.py REPORT.json|REPORT.md [--programs N] [--seed S]
        [--backends userstreams inductor] [--negative]

The parent process generates N programs (``torch_userstreams.testing.strategies``), rendered
for CUDA: each is race-free in eager by construction (every stream waits for the current
stream before touching the inputs, and the current stream waits for every stream before
the results are returned). It re-executes this script once per backend with
``TORCH_CUDA_SANITIZER=1`` (the sanitizer is enabled when torch is imported, so it must be
set before). ``eager`` runs first, uncompiled: it is the baseline. Each child runs every
program forward and backward, synchronizes, and records whether the sanitizer reported a
race ("hazard") or anything else failed ("error").

The report separates the two kinds of race: a program racy in eager is the generator's bug
(listed under ``eager``); a program with a hazard compiled but not in eager is a race the
compiler or the package made (``compiled_only``, per backend). With ``--negative`` it also
checks itself: the first program, with one of its fork waits removed, must be reported as
racy in eager.

Backends: ``userstreams`` (Inductor with the package) and ``inductor`` (native, package not
installed) by default; ``userstreams_aot_eager`` and ``aot_eager`` also work. The sanitizer
sees aten ops only, so races inside Triton kernels are invisible to it; the aot_eager-style
backends run every op as an aten op.
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
EAGER = "eager"
NATIVE = ("inductor", "aot_eager")
NEGATIVE = "negative"  # the key of the self-check program


def generate(count: int, seed: int) -> list[Any]:
    """``count`` programs, the same for the same seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    from torch_userstreams.testing.strategies import programs

    drawn: list[Any] = []

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
        drawn.append(program)

    collect()
    return drawn[:count]


def reads_an_input(program: Any) -> str | None:
    """The first stream whose ``with`` block reads ``x`` or ``w`` directly."""
    from torch_userstreams.testing.programs import LEAVES, Op, With

    def visit(statements: Any, stream: str | None) -> str | None:
        for statement in statements:
            if isinstance(statement, With):
                found = visit(statement.body, statement.stream)
                if found:
                    return found
            elif isinstance(statement, Op) and stream and set(statement.args) & set(LEAVES):
                return stream
        return None

    return visit(program.body, None)


def without_one_fork(program: Any) -> str:
    """``program``'s CUDA source minus the wait that orders one stream's input reads."""
    stream = reads_an_input(program)
    source = program.source(eager=False, device=DEVICE)
    line = f"    forked.wait({stream})\n"
    if stream is None or line not in source:
        raise ValueError("the program has no stream that reads an input: nothing to remove")
    return source.replace(line, "", 1)


def run_one(source: str, backend: str) -> dict[str, Any]:
    """Run one program (compiled unless ``backend`` is eager), forward and backward."""
    import torch

    from torch_userstreams.testing.programs import build_source

    program = build_source(source, eager=backend == EAGER)
    params = program.__code__.co_varnames[: program.__code__.co_argcount]
    x = torch.randn(4, device=DEVICE, requires_grad=True)
    w = torch.randn(4, device=DEVICE, requires_grad=True)
    streams = [torch.Stream(device=DEVICE) for _ in params[2:]]
    torch._dynamo.reset()
    started = time.perf_counter()
    try:
        fn = program if backend == EAGER else torch.compile(program, backend=backend)
        out = fn(x, w, *streams)
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

    if backend not in (EAGER, *NATIVE):
        import torch_userstreams

        torch_userstreams.install()
    sources: dict[str, str] = json.loads(Path(programs_path).read_text())
    results = {key: run_one(source, backend) for key, source in sources.items()}
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


def classify(runs: list[dict[str, Any]], keys: list[str]) -> dict[str, Any]:
    """What the runs say, eager (the first run) as the baseline.

    ``eager``: the programs racy (or failing) in eager. Per compiled backend:
    ``compiled_only`` the programs with a hazard compiled but none in eager, ``errors`` the
    programs that failed otherwise, ``crashed`` when its child process died.
    """
    eager, *compiled = runs
    if eager.get("backend") != EAGER:
        raise ValueError("the first run must be the eager baseline")
    baseline = eager.get("results", {})
    clean = [k for k in keys if baseline.get(k, {}).get("status") == "ok"]
    verdict: dict[str, Any] = {
        EAGER: {
            "hazard": [k for k in keys if baseline.get(k, {}).get("status") == "hazard"],
            "error": [k for k in keys if baseline.get(k, {}).get("status") == "error"],
            "crashed": "crashed" in eager,
        },
        "backends": {},
    }
    for run in compiled:
        results = run.get("results", {})
        status = {k: results.get(k, {}).get("status") for k in keys}
        verdict["backends"][run["backend"]] = {
            "compiled_only": [k for k in clean if status[k] == "hazard"],
            "errors": [k for k in keys if status[k] == "error"],
            "ok": sum(1 for k in keys if status[k] == "ok"),
            "crashed": "crashed" in run,
        }
    return verdict


def negative_check(verdict: dict[str, Any]) -> bool:
    """The self-check passes when the program with a removed wait was racy in eager."""
    return NEGATIVE in verdict[EAGER]["hazard"]


def markdown(report: dict[str, Any]) -> str:
    verdict = report["verdict"]
    lines = [f"# CUDA sanitizer check: {report['programs']} programs, seed {report['seed']}", ""]
    eager = verdict[EAGER]
    programs = [k for k in report["sources"] if k != NEGATIVE]
    lines.append(
        f"eager baseline: {len(programs) - len(set(eager['hazard']) - {NEGATIVE})} of "
        f"{len(programs)} race-free; racy in eager: {sorted(set(eager['hazard']) - {NEGATIVE})};"
        f" errors: {eager['error']}"
    )
    if NEGATIVE in report["sources"]:
        passed = "passed" if negative_check(verdict) else "FAILED"
        lines.append(f"negative check (one fork wait removed, must race in eager): {passed}")
    lines.append("")
    for backend, found in verdict["backends"].items():
        lines.append(
            f"- {backend}: ok {found['ok']}, races compiled but not in eager "
            f"{found['compiled_only']}, errors {found['errors']}"
            + (" (child crashed)" if found["crashed"] else "")
        )
    lines.append("")
    for run in report["runs"]:
        if "crashed" in run:
            lines += [f"## {run['backend']}: child crashed (exit {run['crashed']})", "```"]
            lines += [run["stderr"], "```", ""]
            continue
        for key, result in run["results"].items():
            if result["status"] != "ok":
                lines += [f"### {run['backend']}, program {key}: {result['status']}", "```"]
                lines += [result["detail"].rstrip(), "```", ""]
    lines += ["## programs", ""]
    for key, source in report["sources"].items():
        lines += [f"### program {key}", "```python", source.rstrip(), "```", ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--child"]:
        child(*argv[1:4])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report", help="output file: .json, or markdown otherwise")
    parser.add_argument("--programs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backends", nargs="*", default=["userstreams", "inductor"])
    parser.add_argument(
        "--negative", action="store_true", help="also check that a removed wait is caught"
    )
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("cuda_sanitizer_check: CUDA is not available on this machine; it needs a GPU.")
        return 2
    programs = generate(args.programs, args.seed)
    sources = {str(i): p.source(eager=False, device=DEVICE) for i, p in enumerate(programs)}
    if args.negative:
        sources[NEGATIVE] = without_one_fork(next(p for p in programs if reads_an_input(p)))
    backends = [EAGER, *(b for b in args.backends if b != EAGER)]
    with tempfile.TemporaryDirectory() as workdir:
        programs_path = os.path.join(workdir, "programs.json")
        Path(programs_path).write_text(json.dumps(sources))
        runs = [run_backend(backend, programs_path, workdir) for backend in backends]
    verdict = classify(runs, list(sources))
    report = {
        "programs": len(programs),
        "seed": args.seed,
        "verdict": verdict,
        "runs": runs,
        "sources": sources,
    }
    text = json.dumps(report, indent=1) if args.report.endswith(".json") else markdown(report)
    Path(args.report).write_text(text)
    print(f"cuda_sanitizer_check: {len(programs)} programs x {len(runs)} runs -> {args.report}")
    failed = args.negative and not negative_check(verdict)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
