"""The demo model: blocks whose second branch runs on a stream created in ``forward``.

Creating the stream and events inside the compiled function is the case the package is
for: natively, Dynamo keeps every such object alive forever (one set per call); with the
package each call binds its own and drops them when it is done.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..simulator import SimEvent, SimStream

Batch = tuple[torch.Tensor, torch.Tensor]


class SideStreamBlock(nn.Module):
    """``x + main(x) + side(x)``, with ``side`` on its own stream, forked and joined by events.

    With ``streams=False`` it computes the same without any stream or event: the baseline
    for what streams cost a compile.
    """

    def __init__(self, dim: int, device: torch.device, streams: bool = True) -> None:
        super().__init__()
        self.device = device
        self.streams = streams
        self.main = nn.Linear(dim, dim, device=device)
        self.side = nn.Linear(dim, dim, device=device)

    def _main_stream(self) -> torch.Stream:
        # CPU has no current stream to ask torch.accelerator for: make one (same values,
        # CPU runs everything in program order).
        if self.device.type == "cpu":
            return torch.Stream(device=self.device)
        return torch.accelerator.current_stream(self.device)

    def objects(self) -> tuple[torch.Stream, torch.Stream, torch.Event, torch.Event]:
        """The main and side streams and the fork and join events of one forward: made in
        it, which is the case the package is for."""
        return (
            self._main_stream(),
            torch.Stream(device=self.device),
            torch.Event(device=self.device),
            torch.Event(device=self.device),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.streams:
            return x + torch.relu(self.main(x)) + torch.tanh(self.side(x))
        main, side, ready, done = self.objects()
        ready.record(main)  # fork: x is ready on main
        ready.wait(side)
        with side:
            branch = torch.tanh(self.side(x))
        done.record(side)  # join: the branch is ready on side
        with main:
            done.wait(main)
            return x + torch.relu(self.main(x)) + branch


class DemoModel(nn.Module):
    """A stack of side-stream blocks and a linear head: a regression to one number."""

    def __init__(self, dim: int, blocks: int, device: torch.device, streams: bool = True) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(SideStreamBlock(dim, device, streams) for _ in range(blocks)))
        self.head = nn.Linear(dim, 1, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


class ForwardAndLoss(nn.Module):
    """The model and its loss (mean squared error) as one module: what the demo compiles.

    A compiled training step can take its loss in: the loss and its backward then run inside
    the model's compiled graphs instead of as eager ops after them (either way a step makes
    one compiled call each way). Eager runs the same module, uncompiled.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.model(x), y)


def build_model(
    dim: int, blocks: int, device: torch.device, seed: int, streams: bool = True
) -> DemoModel:
    """The same weights for every run with the same seed (with or without streams)."""
    torch.manual_seed(seed)
    return DemoModel(dim, blocks, device, streams)


def make_batches(steps: int, batch: int, dim: int, device: torch.device, seed: int) -> list[Batch]:
    """One batch per step, from a fixed random teacher, so the loss can go down."""
    gen = torch.Generator().manual_seed(seed + 1)
    teacher = torch.randn(dim, 1, generator=gen) / dim**0.5
    batches = []
    for _ in range(steps):
        x = torch.randn(batch, dim, generator=gen)
        y = torch.sin(x @ teacher) + 0.01 * torch.randn(batch, 1, generator=gen)
        batches.append((x.to(device), y.to(device)))
    return batches


@contextlib.contextmanager
def simulated_objects(device: torch.device) -> Iterator[None]:
    """Eager CPU events refuse to ``record()``: the eager reference uses simulated ones.

    Only for the eager run, never while compiling. On other devices nothing changes.
    """
    if device.type != "cpu":
        yield
        return
    saved = torch.Stream, torch.Event
    torch.Stream, torch.Event = SimStream, SimEvent  # type: ignore[misc]
    try:
        yield
    finally:
        torch.Stream, torch.Event = saved  # type: ignore[misc]
