"""What ``test_distributed.py`` runs on each gloo rank (importable by the spawned ranks)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import torch_userstreams
from torch_userstreams.demo import distributed
from torch_userstreams.demo.config import DemoConfig
from torch_userstreams.demo.model import simulated_objects
from torch_userstreams.simulator import SimStream

BACKENDS = ("userstreams_aot_eager", "userstreams")


def ddp_training(rank: int, world_size: int) -> dict[str, Any]:
    """The distributed demo's training on this rank, with each package backend."""
    reports = {}
    for backend in BACKENDS:
        config = DemoConfig(steps=4, backend=backend, progress=False)
        reports[backend] = dataclasses.asdict(distributed.train_rank(rank, world_size, config))
    return reports


def all_reduce_on_a_user_stream(
    x: torch.Tensor, w: torch.Tensor, comm: torch.Stream
) -> torch.Tensor:
    import torch.distributed._functional_collectives as funcol

    main = torch.Stream(device="cpu")
    with comm:
        y = funcol.all_reduce(torch.tanh(x @ w), "sum", dist.group.WORLD)
    joined = torch.Event(device="cpu")
    joined.record(comm)
    joined.wait(main)
    with main:
        return (y * w.sum()).sum()


def collective_on_a_stream(rank: int, world_size: int) -> dict[str, Any]:
    """Compiled forward and backward against eager: (loss difference, gradient difference)."""
    torch_userstreams.install()
    found = {}
    for backend in BACKENDS:
        torch._dynamo.reset()
        generator = torch.Generator().manual_seed(rank)
        x = torch.randn(4, 8, generator=generator)
        w = torch.randn(8, 8, generator=generator, requires_grad=True)
        loss = torch.compile(all_reduce_on_a_user_stream, backend=backend)(
            x, w, SimStream(device="cpu")
        )
        loss.backward()
        eager_w = w.detach().clone().requires_grad_()
        with simulated_objects(torch.device("cpu")):
            eager_loss = all_reduce_on_a_user_stream(x, eager_w, SimStream(device="cpu"))
        eager_loss.backward()
        found[backend] = (
            (loss - eager_loss).abs().item(),
            (w.grad - eager_w.grad).abs().max().item(),  # type: ignore[operator]
        )
    torch_userstreams.uninstall()
    return found


class SideStreamBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.main = nn.Linear(dim, dim)
        self.side = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side, main = torch.Stream(device="cpu"), torch.Stream(device="cpu")
        ready = torch.Event(device="cpu")
        with side:
            branch = torch.tanh(self.side(x))
        ready.record(side)
        ready.wait(main)
        with main:
            return x + torch.relu(self.main(x)) + branch


def fsdp2_training(rank: int, world_size: int) -> dict[str, float]:
    """fully_shard on side-stream blocks, compiled, against eager FSDP2: gradient difference."""
    from torch.distributed.fsdp import fully_shard

    torch_userstreams.install()
    found = {}
    for backend in BACKENDS:
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = nn.Sequential(*(SideStreamBlock(16) for _ in range(2)))
        reference = copy.deepcopy(model)
        for tree in (model, reference):
            for block in tree:
                fully_shard(block)
            fully_shard(tree)
        x = torch.randn(4, 16, generator=torch.Generator().manual_seed(rank))
        torch.compile(model, backend=backend)(x).sum().backward()
        with simulated_objects(torch.device("cpu")):
            reference(x).sum().backward()
        found[backend] = max(
            (a.grad.full_tensor() - b.grad.full_tensor()).abs().max().item()  # type: ignore[union-attr]
            for a, b in zip(model.parameters(), reference.parameters(), strict=True)
        )
    torch_userstreams.uninstall()
    return found
