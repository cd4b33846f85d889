"""The demo's printed summary: one column per run, parity against eager, each graph's table."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .alternating import BLOCKS, STEPS_PER_BLOCK
from .config import DemoConfig
from .train import RunResult

Cell = Callable[[RunResult, RunResult], str]


def loss_diff(run: RunResult, reference: RunResult) -> float | None:
    """Max |loss - reference loss| over the steps both runs completed."""
    pairs = list(zip(run.losses, reference.losses, strict=False))
    return max((abs(a - b) for a, b in pairs), default=None)


def grad_diff(run: RunResult, reference: RunResult) -> float | None:
    """Max |grad - reference grad| over every parameter's final gradient."""
    if not run.grads or len(run.grads) != len(reference.grads):
        return None
    return max(
        (a.to(b.device) - b).abs().max().item()
        for a, b in zip(run.grads, reference.grads, strict=True)
    )


def _num(value: float | None, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def _final_loss(run: RunResult, _: RunResult) -> str:
    return _num(run.losses[-1] if run.losses else None, ".6f")


def _steps(run: RunResult, reference: RunResult) -> str:
    return f"{len(run.losses)}/{len(reference.losses)}"


def _loss_parity(run: RunResult, reference: RunResult) -> str:
    return "-" if run is reference else _num(loss_diff(run, reference), ".3e")


def _grad_parity(run: RunResult, reference: RunResult) -> str:
    return "-" if run is reference else _num(grad_diff(run, reference), ".3e")


def _speed(run: RunResult, _: RunResult) -> str:
    return _num(run.steps_per_s, ".1f")


def _compile(run: RunResult, _: RunResult) -> str:
    return _num(run.compile_s, ".2f", " s")


def _live(run: RunResult, _: RunResult) -> str:
    return f"{run.live_start} / {_num(run.live_after_first, 'd')} / {run.live_end}"


def _growth(run: RunResult, _: RunResult) -> str:
    """What accumulated per call: the change from step 1 to the end."""
    if run.live_after_first is None:
        return "-"
    grown = run.live_end - run.live_after_first
    return f"{grown:+d} over {max(len(run.losses) - 1, 0)} steps"


def _status(run: RunResult, _: RunResult) -> str:
    return "ok" if run.error is None else f"failed: {run.error}"


ROWS: tuple[tuple[str, Cell], ...] = (
    ("steps completed", _steps),
    ("final loss", _final_loss),
    ("max |loss - eager| per step", _loss_parity),
    ("max |grad - eager| final", _grad_parity),
    ("steps/s (after step 1)", _speed),
    ("compile time (step 1)", _compile),
    ("live streams+events start/step 1/end", _live),
    ("live growth after step 1", _growth),
    ("status", _status),
)


def side_by_side(runs: Sequence[RunResult], reference: RunResult) -> str:
    """A text table, one column per run; the status row (maybe long) comes last."""
    header = ["", *(run.name for run in runs)]
    body = [[label, *(cell(run, reference) for run in runs)] for label, cell in ROWS]
    widths = [max(len(row[i]) for row in [header, *body[:-1]]) for i in range(len(header))]
    lines = []
    for row in [header, *body]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def parity_ok(run: RunResult, reference: RunResult, tolerance: float) -> bool:
    """Every step ran, and losses and final gradients are within ``tolerance`` of eager."""
    losses, grads = loss_diff(run, reference), grad_diff(run, reference)
    complete = run.error is None and len(run.losses) == len(reference.losses)
    return complete and losses is not None and grads is not None and max(losses, grads) <= tolerance


def parity_verdict(run: RunResult, reference: RunResult, tolerance: float) -> str:
    """One line saying whether ``run`` matches eager within ``tolerance``, and by how much."""
    if run.error is not None:
        return f"{run.name}: no parity check, the run failed: {run.error}"
    losses, grads = loss_diff(run, reference), grad_diff(run, reference)
    ok = parity_ok(run, reference, tolerance)
    return (
        f"{run.name}: parity with eager {'OK' if ok else 'EXCEEDED'} (tolerance {tolerance:g}): "
        f"loss {_num(losses, '.3e')} over {len(run.losses)} steps, "
        f"final gradients {_num(grads, '.3e')}"
    )


def speed_line(run: RunResult, reference: RunResult) -> str:
    """The speed verdict: the ratio from alternating blocks (``alternating``), where it was
    measured, else from the two runs' steady steps."""
    fast, base = run.steps_per_s, reference.steps_per_s
    if fast is None or base is None:
        return f"{run.name}: no speed comparison"
    compile_s = _num(run.compile_s, ".2f", " s")
    if run.speedup is not None:
        return (
            f"{run.name}: {run.speedup:.2f}x eager's steps/s (median of {BLOCKS} pairs of "
            f"{STEPS_PER_BLOCK}-step blocks taking turns); compile (first step) {compile_s}"
        )
    return (
        f"{run.name}: {fast:.1f} steps/s vs eager {base:.1f} steps/s ({fast / base:.2f}x, "
        f"one run each); compile (first step) {compile_s}"
    )


def tables_text(run: RunResult) -> str:
    """``describe()`` of each graph's user-object table, as collected during the run."""
    if not run.tables:
        return f"user-object tables of {run.name}: none collected"
    parts = [f"user-object tables of {run.name}: {len(run.tables)} graph(s)"]
    parts.extend(table.describe() for table in run.tables)
    return "\n".join(parts)


def header(config: DemoConfig) -> str:
    return (
        f"torch_userstreams demo: {config.blocks} side-stream blocks (dim {config.dim}), "
        f"batch {config.batch}, {config.steps} steps of SGD (lr {config.lr:g}), "
        f"seed {config.seed}\ndevice {config.device}, backend {config.backend!r}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} CPU thread(s)"
    )


LIVE_NOTE = (
    "live streams+events: every torch.Stream/torch.Event alive in the process (a gc scan)."
    "\n'step 1' includes the objects of the call just made and those the "
    "compiled graph keeps from compiling; growth after step 1 is what piles up per call;\n"
    "a run's start includes whatever the runs before it left alive."
)


VERBOSE_NOTE = "each graph's user objects, its prologue and what the passes did: -v"


def summary(config: DemoConfig, eager: RunResult, compiled: Sequence[RunResult]) -> str:
    """Everything the demo prints at the end, in reading order: the run's details first, the
    verdict (parity, speed) last, where a terminal shows it."""
    verdict = [
        *(parity_verdict(run, eager, config.parity_tolerance) for run in compiled),
        *(speed_line(run, eager) for run in compiled if run.error is None),
    ]
    if config.quiet:
        return "\n".join(verdict)
    details = [tables_text(compiled[0]), ""] if config.verbose else []
    parts = [
        header(config),
        "",
        *details,
        side_by_side([eager, *compiled], eager),
        LIVE_NOTE,
        *([] if config.verbose else [VERBOSE_NOTE]),
        "",
        *verdict,
    ]
    return "\n".join(parts)
