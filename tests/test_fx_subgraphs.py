"""``fx.subgraphs``: the one walk into the graphs a graph calls."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.fx

from torch_userstreams.fx.subgraphs import attribute, called_by, held_by, reachable


def invoke(body: Any, *args: Any) -> Any:
    """Stands for a higher-order op: calls the graph it is given."""
    return body(*args)


class _ControlDeps:
    """Named like torch's ``control_deps``: its subgraph only holds a sync."""

    _name = "control_deps"
    __name__ = "control_deps"

    def __call__(self, *args: Any) -> Any:
        return args


def _leaf(name: str) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(torch.sin, (x,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    gm.meta["name"] = name
    return gm


def _calling(root: torch.nn.Module, *targets: str, in_tuple: bool = False) -> torch.fx.GraphModule:
    """A graph over ``root`` that calls each of ``targets`` (dotted attribute paths)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    for target in targets:
        body = graph.get_attr(target)
        args = ((body,), x) if in_tuple else (body, x)
        x = graph.call_function(invoke, args)
    graph.output(x)
    return torch.fx.GraphModule(root, graph)


def test_a_dotted_target_is_followed_and_a_missing_one_reads_none() -> None:
    root = torch.nn.Module()
    root.outer = torch.nn.Module()
    root.outer.inner = _leaf("inner")
    gm = _calling(root, "outer.inner")
    get_attr = next(n for n in gm.graph.nodes if n.op == "get_attr")
    assert attribute(gm, get_attr) is root.outer.inner
    get_attr.target = "outer.gone"
    assert attribute(gm, get_attr) is None
    with pytest.raises(AttributeError, match="gone"):
        attribute(gm, get_attr, required=True)


def test_a_call_reads_its_graphs_once_each_and_inside_tuples() -> None:
    root = torch.nn.Module()
    root.body = _leaf("body")
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    body = graph.get_attr("body")
    call = graph.call_function(invoke, ((body, body), x))
    graph.output(call)
    gm = torch.fx.GraphModule(root, graph)
    assert called_by(gm, call) == [gm.body]
    assert called_by(gm, body) == []  # the get_attr itself calls nothing


def test_a_control_deps_body_is_not_a_call_but_is_held() -> None:
    root = torch.nn.Module()
    root.sync_body = _leaf("sync")
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    deps = graph.call_function(_ControlDeps(), ((x,), graph.get_attr("sync_body"), x))
    graph.output(deps)
    gm = torch.fx.GraphModule(root, graph)
    assert called_by(gm, deps) == []
    assert [sub.module for sub in reachable(gm)] == [gm]
    assert gm.sync_body in held_by(gm)


def test_reachable_walks_nested_calls_once_each_with_their_paths() -> None:
    shared = _leaf("shared")
    middle_root = torch.nn.Module()
    middle_root.shared = shared
    middle = _calling(middle_root, "shared")
    root = torch.nn.Module()
    root.blocks = torch.nn.Module()
    root.blocks.middle = middle
    root.shared = shared
    gm = _calling(root, "blocks.middle", "shared", in_tuple=True)
    found = reachable(gm)
    assert [sub.module for sub in found] == [gm, gm.blocks.middle, shared]
    assert [sub.where() for sub in found] == ["", "subgraph blocks.middle: ", "subgraph shared: "]
    # the shared body is reached once, by the first call that reaches it
    assert sum(sub.module is shared for sub in found) == 1
