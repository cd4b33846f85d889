"""torch.distributed with user streams, compiled: 2 gloo ranks on this machine.

Each test spawns its ranks (``testing.ranks.run_on_ranks``: a free port, a time limit, and a
clear failure naming the rank that raised, died or hung) and checks every rank's outcome.
The per-rank programs are in ``distributed_cases.py``.
"""

from __future__ import annotations

import pytest
import torch.distributed as dist
from distributed_cases import (
    BACKENDS,
    collective_on_a_stream,
    ddp_training,
    fsdp2_training,
)

from torch_userstreams.testing.ranks import RankFailure, run_on_ranks

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="this torch build has no torch.distributed with gloo",
)
WORLD = 2
TOLERANCE = 1e-5


def test_ddp_graph_splits_resolve_their_calls_objects() -> None:
    """Dynamo's DDP optimizer compiles one graph per bucket; every one's forward and backward
    resolves its own call's objects: gradients equal eager DDP, +0 live objects per step."""
    for rank, reports in enumerate(run_on_ranks(ddp_training, WORLD)):
        for backend in BACKENDS:
            report = reports[backend]
            assert report["error"] is None, (rank, backend, report)
            assert report["graphs"] >= 2, f"rank {rank}: DDP did not split the graph"
            assert max(report["loss_diff"], report["grad_diff"]) <= TOLERANCE, (rank, report)
            assert report["live_growth"] <= 0, (rank, backend, report)


def test_collective_on_a_user_stream_matches_eager() -> None:
    for rank, found in enumerate(run_on_ranks(collective_on_a_stream, WORLD)):
        for backend in BACKENDS:
            loss, grad = found[backend]
            # Inductor's fused code rounds differently: float32 tolerance, not bit equality.
            assert loss <= 1e-4 and grad <= 1e-4, (rank, backend, found[backend])


def test_fsdp2_with_side_streams_matches_eager_fsdp2() -> None:
    for rank, found in enumerate(run_on_ranks(fsdp2_training, WORLD)):
        for backend in BACKENDS:
            assert found[backend] <= 1e-5, (rank, backend, found[backend])


def failing_rank(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank 1 gives up")
    dist.barrier()  # rank 0 would wait here forever


def test_a_failing_rank_is_named_and_the_other_does_not_hang_the_run() -> None:
    with pytest.raises(RankFailure) as info:
        run_on_ranks(failing_rank, WORLD, timeout_s=60)
    assert "rank 1 of 2 failed" in str(info.value) and "rank 1 gives up" in str(info.value)
