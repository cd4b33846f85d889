"""Sizes shared by every benchmark, so ``--quick`` and ``--calls`` scale them all at once."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Config:
    """How much work each benchmark does."""

    calls: int = 10_000  # timed calls per sample; also the live-object call count
    repeats: int = 7  # samples (compiled sessions) per mode; the median is reported
    compile_repeats: int = 5  # fresh compiles per mode for compile_time
    cuda_iters: int = 50  # iterations per CUDA overlap sample

    @classmethod
    def quick(cls) -> Config:
        """Small enough to finish well under two minutes on a 2-core CPU machine."""
        return cls(calls=2_000, repeats=5, compile_repeats=3, cuda_iters=20)
