"""Pointwise values and reductions computed right after what they read, on their stream, so
that Inductor fuses them into the kernel that made their operands.

AOTAutograd's partitioner puts a value the backward needs (a ReLU's mask, ``1 - tanh**2``)
at the end of the forward graph, after every sync of the graph; the backward records an
event for each gradient as it is made, so a bias's gradient (a sum) comes after the record
for its weight's. A sync is a barrier Inductor's scheduler does not fuse across, so each
such value becomes a kernel of its own (in the forward, in a stream block of its own), where
Inductor without streams computes it in the kernel that made what it reads. This pass moves
each one back up, to right after the last node it reads.

The move keeps the program's order of work on every stream:

* the value reads only values made on its own stream, so no wait it passes orders
  anything it reads (a value made on another stream, or a graph input, keeps its place);
* it is a pure pointwise op or reduction (no randomness, no mutation), and no node it
  passes writes what it reads;
* passing a record on its stream only adds it to the work the record covers, and it
  allocates its output earlier, while no buffer freed by a later sync is free yet.

Only where the package places the nodes on their streams (torch 2.11,
``placed_streams.PLACED``): there, every value lowered before a sync that a later node reads
is computed before it, so a value moved up is computed before the syncs it passed, with what
it reads. Inductor 2.12+ keeps a sync after the values its ``control_deps`` follows, and a
value moved up let Inductor compute one of those inside a kernel it launched after the sync
(the race detector found a dealloc sync issued before the last read of its buffer).
"""

from __future__ import annotations

import torch
import torch.fx

from ..fx.meta import stream_of
from ..fx.ops import is_sync_op


def fusable(node: torch.fx.Node) -> bool:
    """A pure pointwise op or reduction: what Inductor fuses into its operands' kernel."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    tags = target.tags
    return (
        (torch.Tag.pointwise in tags or torch.Tag.reduction in tags)
        and torch.Tag.nondeterministic_seeded not in tags
        and not target._schema.is_mutable
    )


def may_write(node: torch.fx.Node) -> bool:
    """Whether ``node`` may write a tensor it reads: anything but a sync or a functional op."""
    if node.op != "call_function" or is_sync_op(node.target):
        return False
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return bool(target._schema.is_mutable)
    return True  # a higher-order op or a Python function: unknown, kept in place


def _anchor(node: torch.fx.Node, stream: int | None) -> torch.fx.Node | None:
    """The last node ``node`` reads, if ``node`` may move to right after it: everything it
    reads is made on ``stream``, and nothing between writes anything."""
    reads = node.all_input_nodes
    if not reads or any(r.op != "call_function" or stream_of(r) != stream for r in reads):
        return None
    passed: list[torch.fx.Node] = []
    cursor = node.prev
    while cursor not in reads:
        passed.append(cursor)
        cursor = cursor.prev
    if any(may_write(n) for n in passed):
        return None
    # Worth a move only past a sync or another stream's work: otherwise Inductor fuses as is.
    if not any(is_sync_op(n.target) or stream_of(n) != stream for n in passed):
        return None
    return cursor


def computed_early(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Move each pure pointwise value or reduction of ``gm`` whose operands its own stream
    made to right after the last of them (module docstring); the nodes moved, in order."""
    moved = []
    for node in list(gm.graph.nodes):
        if not fusable(node):
            continue
        anchor = _anchor(node, stream_of(node))  # (None: the stream the call began on)
        if anchor is not None:
            anchor.append(node)
            moved.append(node)
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved
