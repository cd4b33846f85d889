"""Inductor 2.11's pattern matcher keeps each node on its stream.

A post-grad pattern (``mm`` then ``add`` of a bias, made one ``addmm``) replaces the nodes it
matched by new ones. On 2.11, while installed:

* nodes of two streams are never matched: they would become one op on one of them. 2.12+
  discards such a match; 2.11 discards only one that crosses a mutation, which it finds by
  comparing ``get_mutation_region_id`` of each matched node. That id now names the node's
  stream too (``wrap_get_mutation_region_id``). Its other caller, the post-grad pass that
  moves a value down to its reader, then moves none to another stream's reader (the backend
  turns that pass off for graphs with streams anyway);
* the new nodes run on the stream of those they replace (``wrap_replace_with_graph``). 2.11
  gave them the annotation of the replacement's own trace, none: the demo's backward
  ``mm`` and gradient ``add`` on a side stream became an ``addmm`` on the current stream,
  reading the side stream's values with no sync.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.fx

from ..fx.meta import set_stream, stream_of
from ..originals import carries

RegionId = Callable[[torch.fx.Graph, torch.fx.Node], Any]
Replace = Callable[..., None]


def wrap_get_mutation_region_id(native: RegionId) -> RegionId:
    """The replacement: native's id and the node's stream, equal only where both are."""

    @carries(native)
    def get_mutation_region_id(graph: torch.fx.Graph, node: torch.fx.Node) -> Any:
        return (native(graph, node), stream_of(node))

    return get_mutation_region_id


def wrap_replace_with_graph(native: Replace) -> Replace:
    """The replacement of ``ReplacementPatternEntry.replace_with_graph`` (a staticmethod):
    native's replacement, each node it adds annotated with the matched nodes' stream."""

    @carries(native)
    def replace_with_graph(match: Any, graph: torch.fx.Graph, *args: Any, **kwargs: Any) -> None:
        streams = {stream_of(node) for node in match.nodes}
        (stream,) = streams if len(streams) == 1 else (None,)
        if stream is None:  # nothing to place (a graph without streams pays nothing more)
            native(match, graph, *args, **kwargs)
            return
        before = set(graph.nodes)
        native(match, graph, *args, **kwargs)
        for node in graph.nodes:
            if node not in before and node.op == "call_function" and stream_of(node) is None:
                set_stream(node, stream)

    return replace_with_graph
