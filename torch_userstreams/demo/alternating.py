"""The demo's speed ratio: eager and compiled steps timed in alternating blocks.

One run each, eager first, then compiled, reads the machine twice at different moments: on a
shared or throttling machine the same pair read 0.63x to 1.63x. Blocks that take turns see
the same conditions, and the median of their ratios drops the blocks a hiccup hit.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from .model import Batch

BLOCKS = 7  # pairs of blocks: the median of 7 ratios
STEPS_PER_BLOCK = 5

Step = Callable[[Batch], None]
Clock = Callable[[], float]


def _cycle(batches: list[Batch]) -> Iterator[Batch]:
    while True:
        yield from batches


def _block(step: Step, batches: Iterator[Batch], steps: int, clock: Clock) -> float:
    start = clock()
    for _ in range(steps):
        step(next(batches))
    return clock() - start


def alternating_ratio(
    eager: Step,
    compiled: Step,
    batches: list[Batch],
    eager_context: Callable[[], AbstractContextManager[None]],
    blocks: int = BLOCKS,
    steps: int = STEPS_PER_BLOCK,
    clock: Clock = time.perf_counter,
) -> float:
    """The median over ``blocks`` pairs of eager block time over compiled block time (>1:
    compiled is faster); which of the two goes first alternates from pair to pair. Each step
    must end with the device synchronized (``loss.item()``). ``eager_context`` wraps each
    eager block (simulated objects for eager CPU events)."""
    if not batches:
        raise ValueError("alternating_ratio needs at least one batch")
    source = _cycle(batches)

    def eager_block() -> float:
        with eager_context():
            return _block(eager, source, steps, clock)

    ratios = []
    for pair in range(blocks):
        if pair % 2:
            compiled_time = _block(compiled, source, steps, clock)
            eager_time = eager_block()
        else:
            eager_time = eager_block()
            compiled_time = _block(compiled, source, steps, clock)
        ratios.append(eager_time / compiled_time)
    return statistics.median(ratios)
