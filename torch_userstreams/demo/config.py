"""The demo's settings, shared by every module so a test can shrink all of them at once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

BACKENDS = ("userstreams", "userstreams_aot_eager")
# The native backend each package backend is compared with: the same compiler stack.
NATIVE_BACKEND = {"userstreams": "inductor", "userstreams_aot_eager": "aot_eager"}
CPU = torch.device("cpu")


@dataclass(frozen=True)
class DemoConfig:
    """What to train, where, and what to show."""

    device: torch.device = CPU
    steps: int = 50
    backend: str = "userstreams"
    seed: int = 0
    dim: int = 64
    blocks: int = 2
    batch: int = 64
    lr: float = 0.05
    # Parity with eager. GPU kernels that Inductor fuses reassociate float32 sums, so the
    # CUDA runs get more room; a wrong event or a race shows as far larger errors.
    tolerance: float = 1e-5
    cuda_tolerance: float = 1e-4
    compare_native: bool = False
    timeline: Path | None = None  # a drawing of one step (SVG, or what matplotlib writes)
    trace: Path | None = None  # the same step as a Chrome trace (JSON) for Perfetto
    progress: bool = True
    verbose: bool = False  # each graph's user-object table and what the passes did
    quiet: bool = False  # the verdict only: parity and speed
    # CPU intra-op threads while training. The model is tiny, so more threads only add
    # contention: on a busy 2-core machine a step then takes 100x longer, at random.
    threads: int | None = 1
    distributed: bool = False  # under torchrun: DDP on every rank (demo/distributed.py)

    @property
    def parity_tolerance(self) -> float:
        return self.cuda_tolerance if self.device.type == "cuda" else self.tolerance

    @property
    def native_backend(self) -> str:
        return NATIVE_BACKEND[self.backend]


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when a device is visible, else CPU; ``cuda`` without one is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available (try --device cpu)")
    return torch.device(name)
