#!/usr/bin/env bash
# One command for a machine with a CUDA GPU and torch, no internet, maybe no expecttest:
#
#     tools/gpu_check.sh OUTDIR
#
# Runs, each under its own time limit (at most 9.5 minutes in all on one GPU):
#   1. the `cuda` tests (tests/test_cuda.py and every other test marked cuda that needs no
#      expecttest), beside
#   2. the CUDA sanitizer check (tools/cuda_sanitizer_check.py, eager baseline, --negative),
#      and beside them
#   3. the distributed demo's NCCL path with one rank (torchrun);
#   then, alone on the GPU so that their timings mean something,
#   4. the demo on CUDA with --compare-native, and
#   5. `python -m benchmarks --quick` (CUDA overlap and demo rows included).
# Writes OUTDIR/summary.md (each part's result and the numbers to paste into a closing note)
# and one log per part. The package is used from this checkout: when it is not installed,
# its backends are registered through a temporary entry-point record (no pip, no network).
# Exit status: 0 when every part passed; 3, with nothing run, when torch does not import or
# sees no CUDA device (summary.md says which).
set -uo pipefail

OUT=${1:?usage: tools/gpu_check.sh OUTDIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT" || exit 2

SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}"

# Entry points make backend="userstreams" resolvable; write them unless installed.
"$PYTHON" - "$SITE" <<'PY'
import importlib.metadata as md, pathlib, sys, tomllib
try:
    md.distribution("torch-userstreams")
except md.PackageNotFoundError:
    project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
    info = pathlib.Path(sys.argv[1]) / f"torch_userstreams-{project['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: torch-userstreams\nVersion: {project['version']}\n"
    )
    lines = ["[torch_dynamo_backends]"]
    lines += [f"{k} = {v}" for k, v in project["entry-points"]["torch_dynamo_backends"].items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
PY

# Without a usable CUDA device every cuda test skips and the rest measures the CPU: say so
# and stop, rather than report "passed" for a check that checked nothing.
if ! NO_CUDA=$("$PYTHON" - 2>&1 <<'PY'
import sys, torch
if not torch.cuda.is_available():
    sys.exit(f"torch {torch.__version__} sees no CUDA device (torch.version.cuda: "
             f"{torch.version.cuda}); run this on a machine with a GPU and a CUDA build of torch")
PY
); then
  NO_CUDA=${NO_CUDA##*$'\n'}  # the last line: torch may warn first (no NumPy, say)
  printf '# tools/gpu_check.sh summary\n\nNOT RUN: %s\n' "$NO_CUDA" >"$OUT/summary.md"
  echo "gpu_check: not run: $NO_CUDA" >&2
  exit 3
fi

STATUS="$SITE/status"
mkdir -p "$STATUS"

part() {  # part LIMIT_S LOG -- command... : run it, keep "exit-status seconds" for the summary
  local limit=$1 log=$2 start=$SECONDS
  shift 3
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$log" 2>&1
  echo "$? $((SECONDS - start)) $limit" >"$STATUS/$log"
}

row() {  # row NAME LOG: one line of the summary table
  local name=$1 log=$2 status took limit verdict=passed
  read -r status took limit <"$STATUS/$log" || status=255
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    verdict="TIMED OUT after $limit s"
  elif [ "$status" -ne 0 ]; then
    verdict="FAILED (exit $status)"
  fi
  echo "| $name | $verdict | ${took:-?} | $log |"
  [ "$verdict" = passed ]
}

CUDA_TESTS=(tests/test_cuda.py tests/test_sanitizer_check.py)
part 170 tests.log -- "$PYTHON" -m pytest -m cuda -q -rs -p no:cacheprovider -n 4 \
  "${CUDA_TESTS[@]}" &
part 170 sanitizer.log -- "$PYTHON" tools/cuda_sanitizer_check.py "$OUT/sanitizer.md" \
  --programs 8 --negative --backends userstreams inductor &
part 170 nccl.log -- "$PYTHON" -m torch.distributed.run --nproc-per-node 1 \
  -m torch_userstreams.demo --distributed --device cuda --steps 20 &
wait
part 150 demo.log -- "$PYTHON" -m torch_userstreams.demo --device cuda --compare-native \
  --no-progress
part 240 benchmarks.log -- "$PYTHON" -m benchmarks --quick --json "$OUT/benchmarks.json"

FAILED=0
TABLE=$(
  ok=0
  row "cuda tests" tests.log || ok=1
  row "sanitizer check (eager baseline, --negative)" sanitizer.log || ok=1
  row "distributed demo, NCCL, 1 rank" nccl.log || ok=1
  row "demo (cuda, --compare-native)" demo.log || ok=1
  row "benchmarks --quick" benchmarks.log || ok=1
  exit $ok
) || FAILED=1

{
  echo "# tools/gpu_check.sh summary"
  echo
  "$PYTHON" - <<'PY'
import platform, torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
print(f"machine: {name}; torch {torch.__version__}; Python {platform.python_version()}")
PY
  echo
  echo "| part | result | seconds | log |"
  echo "| --- | --- | --- | --- |"
  echo "$TABLE"
  echo
  echo "## cuda tests"
  echo '```'
  tail -n 15 "$OUT/tests.log"
  echo '```'
  echo "## sanitizer check"
  echo '```'
  tail -n 3 "$OUT/sanitizer.log"
  [ -f "$OUT/sanitizer.md" ] && sed -n '3,8p' "$OUT/sanitizer.md"
  echo '```'
  echo "## distributed demo (NCCL, 1 rank)"
  echo '```'
  tail -n 12 "$OUT/nccl.log"
  echo '```'
  echo "## demo"
  echo '```'
  tail -n 40 "$OUT/demo.log"
  echo '```'
  echo "## benchmarks"
  echo '```'
  tail -n 40 "$OUT/benchmarks.log"
  echo '```'
} >"$OUT/summary.md"

echo "gpu_check: $( [ "$FAILED" -eq 0 ] && echo all parts passed || echo some parts failed ); see $OUT/summary.md"
exit "$FAILED"
