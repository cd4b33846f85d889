"""The demo's speed verdict: blocks of eager and compiled steps taking turns, on a clock the
steps themselves advance (so the test is exact, not timed)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest


def test_the_speed_ratio_is_the_median_of_blocks_taking_turns() -> None:
    """On a clock the steps advance, compiled steps twice as fast give 2.0, and a hiccup in
    one compiled block (a GC pause, another process) does not move the median. The eager
    context wraps each eager block, and each block sees the next batches in turn."""
    from torch_userstreams.demo.alternating import alternating_ratio

    now = [0.0]
    seen: list[tuple[str, int]] = []
    entered = [0]

    def step(name: str, cost: float) -> Callable[[tuple[int, int]], None]:
        def run(batch: tuple[int, int]) -> None:
            seen.append((name, batch[0]))
            hiccup = 100.0 if name == "compiled" and len(seen) == 12 else 0.0
            now[0] += cost + hiccup

        return run

    @contextlib.contextmanager
    def eager_context() -> Iterator[None]:
        entered[0] += 1
        yield

    batches = [(i, i) for i in range(3)]
    ratio = alternating_ratio(
        step("eager", 2.0),
        step("compiled", 1.0),
        batches,  # type: ignore[arg-type]
        eager_context,
        blocks=5,
        steps=2,
        clock=lambda: now[0],
    )
    assert ratio == 2.0
    assert entered[0] == 5
    # which side goes first alternates: e, e, c, c | c, c, e, e | e ...
    order = [name for name, _ in seen]
    assert order[:9] == ["eager"] * 2 + ["compiled"] * 4 + ["eager"] * 2 + ["eager"]
    assert [batch for _, batch in seen[:5]] == [0, 1, 2, 0, 1]
    with pytest.raises(ValueError, match="at least one batch"):
        alternating_ratio(step("eager", 1.0), step("compiled", 1.0), [], eager_context)
