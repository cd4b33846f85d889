"""``compile.method_syncs``: sync method calls in Dynamo's graph become ``streams`` ops, each
recorded on the op that replaced it (torch 2.11's shape, built by hand on every torch)."""

from __future__ import annotations

import torch
import torch.fx

from torch_userstreams.compile import method_syncs
from torch_userstreams.compile.table import EntryKind, UserObjectTable
from torch_userstreams.fx.meta import records
from torch_userstreams.run.lookup import lookup
from torch_userstreams.run.own_ops import sync_op
from torch_userstreams.simulator import SimEvent, SimStream


def test_method_calls_become_ops_with_their_provenance() -> None:
    table = UserObjectTable("f [0/0]")
    for example in (SimStream(device="cpu"), SimStream(device="cpu"), SimEvent(device="cpu")):
        table.add(EntryKind.INPUT, "L['obj']", lambda cg: None, example, added_by="test")
    graph = torch.fx.Graph()
    side, main, done = (graph.call_function(lookup, (i,)) for i in range(3))
    graph.call_method("wait_stream", (side, main))
    graph.call_method("synchronize", (done,))
    graph.output(None)

    notes = method_syncs.rewrite(graph, table)

    calls = [(n.target, n.args) for n in graph.nodes if n.op == "call_function"][3:]
    assert calls == [
        (sync_op("wait_stream"), (0, 1)),
        (sync_op("synchronize_event"), (2,)),
    ]
    assert not any(n.op == "call_method" for n in graph.nodes)
    wait, sync = (n for n in graph.nodes if n.target in (c[0] for c in calls))
    assert notes == [
        f"SimStream.wait_stream() as an op [{wait.name}]",
        f"SimEvent.synchronize() as an op [{sync.name}]",
    ]
    assert [str(r) for r in records(wait)] == ["method_syncs: SimStream.wait_stream() as an op"]
    assert method_syncs.rewrite(graph, table) == [], "nothing left to rewrite"


def test_the_rewrite_runs_as_a_pass_on_a_traced_graph_and_on_a_subgraph_module() -> None:
    """Dynamo's graph has no module yet (``TracedGraph``); a subgraph it calls does, and its
    code must call the op afterwards. Both report to the compile, which ``explain()`` reads."""
    from torch_userstreams.compile.contract import TracedGraph, run_passes
    from torch_userstreams.compile.graph_compile import GraphCompile

    def graph_syncing(stream: int) -> torch.fx.Graph:
        graph = torch.fx.Graph()
        graph.call_method("synchronize", (graph.call_function(lookup, (stream,)),))
        graph.output(None)
        return graph

    compile_ = GraphCompile()
    compile_.table.graph_name = "f [0/0]"
    compile_.table.add(
        EntryKind.INPUT, "L['s']", lambda cg: None, SimStream(device="cpu"), added_by="test"
    )
    traced = TracedGraph(graph_syncing(0))
    body = torch.fx.GraphModule(torch.nn.Module(), graph_syncing(0))
    assert "synchronize()" in body.code
    run_passes(traced, (method_syncs.PASS,), compile_)
    run_passes(body, (method_syncs.PASS,), compile_)

    for graph in (traced.graph, body.graph):
        assert [n.target for n in graph.nodes if n.op == "call_function"][1:] == [
            sync_op("synchronize_stream")
        ]
    assert "synchronize()" not in body.code and "synchronize_stream" in body.code
    assert (
        compile_.table.pass_notes
        == ["method_syncs: SimStream.synchronize() as an op [synchronize_stream_default]"] * 2
    )
