"""Shared fixtures: a clean Dynamo and a known install state around every test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import torch_userstreams

# Every pass lints the graph it changed (compile/contract.py), in every test.
os.environ.setdefault("TORCH_USERSTREAMS_DEBUG", "1")


# Modules whose tests compile whole training steps, draw generated programs, run benchmarks
# or start processes: every other test is in the quick subset (``pytest -m quick``).
SLOW_MODULES = frozenset(
    {
        "test_accelerator_regions",
        "test_benchmarks_smoke",
        "test_caches",
        "test_core_scenarios",
        "test_demo",
        "test_distributed",
        "test_docs",
        "test_generated_programs",
        "test_hostile_cases",
        "test_races",
        "test_readme",
        "test_sanitizer_check",
        "test_subgraphs",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests outside ``SLOW_MODULES`` are marked ``quick``. Tests marked ``cuda`` run on a
    GPU machine and are skipped, with the reason, elsewhere."""
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__ not in SLOW_MODULES:
            item.add_marker(pytest.mark.quick)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: torch.cuda.is_available() is False")
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch_userstreams.uninstall()
    torch._dynamo.reset()


@pytest.fixture
def installed() -> Iterator[None]:
    torch_userstreams.install()
    yield
    torch_userstreams.uninstall()


@pytest.fixture(autouse=True)
def spy_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remember the binding of every compiled call, for tests that inspect its objects."""
    from helpers import LAST_BINDING

    from torch_userstreams.run import bound_graph
    from torch_userstreams.run.state import state

    real_runner = bound_graph.runner

    def runner(bound: bound_graph.BoundGraph) -> Any:
        run = real_runner(bound)

        def spy(*args: Any) -> Any:
            binding = state.calls.pending
            out = run(*args)
            LAST_BINDING[:] = [binding]
            return out

        return spy

    LAST_BINDING.clear()
    monkeypatch.setattr(bound_graph, "runner", runner)
