"""Run a function on several gloo ranks (processes) of this machine, for tests and benchmarks.

``run_on_ranks(fn, world_size)`` spawns one process per rank on a free local port, runs
``fn(rank, world_size, *args)`` in each after ``init_process_group("gloo")``, and returns
each rank's result, rank 0 first. A rank that raises, dies or does not finish within
``timeout_s`` fails the whole run with an error that says which rank and why; stragglers are
killed, so a hang costs at most the timeout. ``fn`` must be importable by the child
processes (a module-level function).
"""

from __future__ import annotations

import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from ..errors import UserStreamsError


class RankFailure(UserStreamsError):
    """A rank raised, died or hung."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_main(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    results: Any,
) -> None:
    import torch.distributed as dist

    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
        try:
            results.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, False, traceback.format_exc()))


def run_on_ranks(
    fn: Callable[..., Any], world_size: int = 2, *args: Any, timeout_s: float = 300.0
) -> list[Any]:
    """``fn(rank, world_size, *args)`` on each rank; their results, by rank."""
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    processes = [
        context.Process(target=_rank_main, args=(rank, world_size, port, fn, args, results))
        for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + timeout_s
    found: dict[int, Any] = {}
    failed = True
    try:
        while len(found) < world_size:
            remaining = deadline - time.monotonic()
            try:
                rank, ok, value = results.get(timeout=max(0.1, min(remaining, 5.0)))
            except queue.Empty:
                _check_alive(processes, found, remaining)
                continue
            if not ok:
                raise RankFailure(_failures({rank: value}, results, world_size))
            found[rank] = value
        failed = False
    finally:
        for process in processes:
            # After a failure the others may wait for the failed rank forever: no grace.
            process.join(timeout=1.0 if failed else max(1.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
    return [found[rank] for rank in range(world_size)]


def _failures(failed: dict[int, str], results: Any, world_size: int) -> str:
    """Every rank's failure that arrives shortly after the first: a rank often fails only
    because a peer died, so the first report is not always the cause."""
    end = time.monotonic() + 3.0
    while len(failed) < world_size and time.monotonic() < end:
        try:
            rank, ok, value = results.get(timeout=0.2)
        except queue.Empty:
            continue
        if not ok:
            failed[rank] = value
    parts = [f"rank {rank} of {world_size} failed:\n{failed[rank]}" for rank in sorted(failed)]
    return "torch_userstreams: " + "\n".join(parts)


def _check_alive(processes: list[Any], found: dict[int, Any], remaining: float) -> None:
    missing = [rank for rank in range(len(processes)) if rank not in found]
    if remaining <= 0:
        raise RankFailure(
            f"torch_userstreams: rank(s) {missing} did not finish in time (a hang, or a peer "
            "that failed and left them waiting in a collective); their processes are killed."
        )
    dead = [rank for rank in missing if not processes[rank].is_alive()]
    if dead:
        codes = {rank: processes[rank].exitcode for rank in dead}
        raise RankFailure(
            f"torch_userstreams: rank(s) {dead} exited without a result (exit codes {codes})."
        )
