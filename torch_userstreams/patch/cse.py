"""Which nodes of a joint graph AOTAutograd's CSE may merge: never across streams, never syncs.

Before it partitions, the min-cut partitioner (``userstreams``) merges each node into an
earlier one with the same target and arguments (``fx_graph_cse``). The key knows nothing
of streams, so:

* ``(x * w).sin()`` on a side stream and ``(x * w).cos()`` on the main one would share one
  ``x * w``, made on the side stream and read on the main one before any wait: a race;
* a sync issued twice with the same arguments (``s.wait_stream(m)`` before and after more
  work on ``m``) would be kept once, losing the second wait (torch 2.11, which does not
  wrap syncs in ``control_deps``).

The CSE asks ``same_mutation_regions(node, earlier)`` before it merges, and it is that
function's only caller; the replacement adds the two conditions above. On a graph without
streams every node has the same (absent) stream and no sync: it answers as native does.

The CSE remembers one earlier node per key, and a refusal replaces it by the refused node.
So with ``a`` on main, ``b`` (the same op) on a side stream and ``c`` on main again, ``c``
is compared with ``b`` and kept, not merged into ``a``: correct, one op more than ideal.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.fx

from ..fx.meta import stream_of
from ..fx.ops import is_sync_op
from ..originals import carries

SameRegions = Callable[[torch.fx.Node, torch.fx.Node], bool]


def wrap_same_mutation_regions(native: SameRegions) -> SameRegions:
    """The replacement: ``native``'s answer, and the same stream, and no sync."""

    @carries(native)
    def same_mutation_regions(a: torch.fx.Node, b: torch.fx.Node) -> bool:
        if is_sync_op(a.target) or is_sync_op(b.target):
            return False
        return stream_of(a) == stream_of(b) and native(a, b)

    return same_mutation_regions
