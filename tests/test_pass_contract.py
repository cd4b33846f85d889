"""The passes' contract: typed facts, each ensured once and required by a later pass."""

from __future__ import annotations

import pytest
import torch
import torch.fx

from torch_userstreams.backends.inductor_graphs import SPLIT_REQUIRES
from torch_userstreams.compile.contract import Fact, GraphPass, PassContractError, run_passes
from torch_userstreams.inductor import regions, reuse_syncs
from torch_userstreams.passes import (
    backward_phase,
    backward_syncs,
    dealloc_syncs,
    grad_accumulation,
    inherit_streams,
    sync_ordering,
    write_backs,
)

# The order AOTAutograd calls the package's entry points in, each pass in its entry's order.
AOT_ORDER = [
    backward_phase.PASS,
    write_backs.PASS,
    inherit_streams.PASS,
    grad_accumulation.PASS,
    backward_syncs.PASS,
    dealloc_syncs.PASS,
    sync_ordering.PIN,
    sync_ordering.WRAP,
]


# What runs on each forward or backward graph the backend compiles, before its region split.
COMPILED_ORDER = [reuse_syncs.PASS, regions.FACTORIES_PASS]


def _ensured_in_order(order: list[GraphPass]) -> set[Fact]:
    held: set[Fact] = set()
    for graph_pass in order:
        assert graph_pass.requires <= held, graph_pass.name
        assert not graph_pass.ensures & held, f"{graph_pass.name} ensures a fact again"
        held |= graph_pass.ensures
    return held


def test_in_order_every_requirement_holds_and_every_fact_is_needed() -> None:
    joint, compiled = _ensured_in_order(AOT_ORDER), _ensured_in_order(COMPILED_ORDER)
    assert not joint & compiled
    assert joint | compiled == set(Fact), "a fact no pass ensures"
    assert SPLIT_REQUIRES == compiled, "the region split needs every compiled-graph fact"
    required = set().union(*(p.requires for p in AOT_ORDER)) | SPLIT_REQUIRES
    assert required == set(Fact), f"facts nothing requires: {set(Fact) - required}"


def test_a_pass_run_before_what_it_requires_is_refused_by_fact_name() -> None:
    graph = torch.fx.Graph()
    graph.output(graph.placeholder("x"))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(PassContractError) as info:
        run_passes(gm, [dealloc_syncs.PASS], None)
    message = str(info.value)
    assert "pass dealloc_syncs requires ['backward reads synced', 'write-backs in place']" in (
        message
    )
    run_passes(gm, [backward_phase.PASS, write_backs.PASS], None)  # no compile needed
    with pytest.raises(PassContractError, match=r"requires \['backward reads synced'\]"):
        run_passes(gm, [dealloc_syncs.PASS], None)
