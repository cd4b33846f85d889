"""Pure values a wait's ``control_deps`` holds before it, computed after it instead, so that
Inductor fuses them into the kernels that read them.

torch 2.12+ wraps each sync in ``control_deps``: a wait depends on every node its stream ran
since the stream's last sync, and passes through each of those values that a later node
reads. A value the backward computes from a saved tensor (a ReLU's mask, ``1 - tanh**2``)
is often one of them: the partitioner put it before the wait, so ``control_deps`` makes it
an operand of the wait, and Inductor realizes it in a kernel of its own before the wait,
where Inductor without streams computes it inside the kernel that reads it. This pass
takes such values out of the wait's dependencies and operands and computes them right
after it; their readers read them directly.

A value moves only when moving it keeps every stream's program of work:

* it is a pure pointwise op (no randomness, no mutation);
* what reads it is the wait, or another value that moves with it;
* no node between it and the wait is a sync (a record would no longer cover it; a dealloc
  sync of a tensor it reads would come before its read) or may write anything.

So on its own stream it only runs later, after a wait (which orders more, never less); on
any other stream nothing it reads or writes is ordered differently. A constant the wait
holds (``full``, which reads nothing) does not move: the wait lets go of it, and its readers
compute it. A reader of a moved value or a released constant no longer reads the wait's
passthrough; if it ran before the wait after all, it would run where the value was
computed before the move, which was correct too.

Only a wait on an event: a record covers the work issued before it, and so does
``wait_stream`` on the stream it waits for (moving a value of that stream past it races:
the race detector's joined programs), so values before those stay there.
"""

from __future__ import annotations

import copy
import operator
from typing import Any

import torch
import torch.fx

from ..fx.control_deps import is_control_deps, sync_node
from ..fx.ops import is_constant, is_sync_op
from .early_values import fusable, may_write

# A wait on an event only: ``wait_stream`` also covers the work issued so far on the stream
# waited for, as a record would, so that work stays before it.
WAITS = ("wait_event",)


def _pointwise(node: torch.fx.Node) -> bool:
    """A pure pointwise op: no randomness, no mutation."""
    return fusable(node) and torch.Tag.pointwise in node.target.tags  # type: ignore[union-attr]


def _is_wait(gm: torch.fx.GraphModule, node: torch.fx.Node) -> bool:
    if not is_control_deps(node):
        return False
    sync = sync_node(gm, node)
    return sync is not None and getattr(sync.target, "_opname", None) in WAITS


def _movable(wait: torch.fx.Node) -> list[torch.fx.Node]:
    """The operands and dependencies of ``wait`` that may move after it, in graph order:
    the largest set whose every member is pure pointwise, read only by the wait or the set,
    and followed up to the wait by no sync and no node that may write."""
    deps = wait.args[0]
    held = (*(deps if isinstance(deps, (list, tuple)) else ()), *wait.args[2:])
    candidates = {n for n in held if isinstance(n, torch.fx.Node) and _pointwise(n)}
    # Walk back from the wait: a sync or a writer stops every candidate before it.
    passed: set[torch.fx.Node] = set()
    cursor = wait.prev
    while cursor.op != "root":
        if cursor.op == "placeholder":
            break
        if cursor in candidates:
            passed.add(cursor)
        elif cursor.target is operator.getitem:
            pass  # a tuple's item, a passthrough of an earlier sync included: writes nothing
        elif is_sync_op(cursor.target) or is_control_deps(cursor) or may_write(cursor):
            break
        cursor = cursor.prev
    moving = set(passed)
    changed = True
    while changed:  # drop any value read by a node that stays
        changed = False
        for node in list(moving):
            if any(user is not wait and user not in moving for user in node.users):
                moving.discard(node)
                changed = True
    return [n for n in wait.graph.nodes if n in moving]


def _without(values: Any, kept: list[int]) -> Any:
    """A ``control_deps`` value (the sync's result, then its operands) with ``kept`` only."""
    if not isinstance(values, (list, tuple)):
        return values
    return (values[0], *(values[1 + i] for i in kept))


def _fresh_subgraph(gm: torch.fx.GraphModule, wait: torch.fx.Node) -> torch.fx.GraphModule:
    """A copy of ``wait``'s subgraph under a new name, read by ``wait`` alone: the original
    may be shared (the partitioner's modules keep the joint graph's by reference)."""
    attr: torch.fx.Node = wait.args[1]  # type: ignore[assignment]  # (``_rewritable``)
    copied = copy.deepcopy(getattr(gm, str(attr.target)))
    name, suffix = f"{attr.target}_after_waits", 0
    while hasattr(gm, f"{name}_{suffix}"):
        suffix += 1
    gm.add_submodule(f"{name}_{suffix}", copied)
    with gm.graph.inserting_before(wait):
        fresh = gm.graph.get_attr(f"{name}_{suffix}")
    wait.replace_input_with(attr, fresh)
    if not attr.users:
        gm.graph.erase_node(attr)
    return copied


def _drop_operands(
    gm: torch.fx.GraphModule, wait: torch.fx.Node, moving: list[torch.fx.Node]
) -> None:
    """Take ``moving`` out of ``wait``'s dependencies and operands, its subgraph's
    placeholders and outputs, and its passthroughs (their readers read the value itself).
    Item ``i`` of ``wait`` passes operand ``i - 1`` through; item 0 is the sync's result."""
    subgraph = _fresh_subgraph(gm, wait)
    deps, subgraph_attr, *operands = wait.args
    gone = set(moving)
    kept = [i for i, operand in enumerate(operands) if operand not in gone]
    new_item = {1 + old: 1 + new for new, old in enumerate(kept)}
    for user in list(wait.users):
        if user.target is not operator.getitem:
            continue  # a later sync that depends on the wait: reads no operand
        item = int(user.args[1])  # type: ignore[arg-type]
        if item == 0:
            continue
        if item in new_item:
            user.args = (wait, new_item[item])
        else:
            user.replace_all_uses_with(operands[item - 1])  # type: ignore[arg-type]
            wait.graph.erase_node(user)
    placeholders = [n for n in subgraph.graph.nodes if n.op == "placeholder"]
    output = next(n for n in subgraph.graph.nodes if n.op == "output")
    result, *_ = output.args[0]
    output.args = ((result, *(placeholders[i] for i in kept)),)
    for i, placeholder in enumerate(placeholders):
        if i not in kept:
            subgraph.graph.erase_node(placeholder)
    subgraph.recompile()
    kept_deps = tuple(n for n in deps if n not in gone)  # type: ignore[union-attr]
    wait.args = (kept_deps, subgraph_attr, *(operands[i] for i in kept))
    for node in (wait, output):
        if "val" in node.meta:
            node.meta["val"] = _without(node.meta["val"], kept)


def _rewritable(wait: torch.fx.Node) -> bool:
    """Whether ``wait`` has the shape ``_drop_operands`` rewrites: its subgraph returns the
    sync's result and then its placeholders, in order; every reader of ``wait`` is a
    ``getitem`` or a later sync that depends on it."""
    attr = wait.args[1]
    if not isinstance(attr, torch.fx.Node) or attr.op != "get_attr":
        return False
    subgraph = getattr(wait.graph.owning_module, str(attr.target))
    placeholders = [n for n in subgraph.graph.nodes if n.op == "placeholder"]
    output = next(n for n in subgraph.graph.nodes if n.op == "output")
    returned = output.args[0]
    if not isinstance(returned, (list, tuple)) or list(returned[1:]) != placeholders:
        return False
    return all(
        (user.target is operator.getitem and isinstance(user.args[1], int))
        or (is_control_deps(user) and wait not in user.args[2:])
        for user in wait.users
    )


def _constants(wait: torch.fx.Node) -> list[torch.fx.Node]:
    """The constants ``wait`` holds: they stay where they are (nothing orders what reads
    nothing), but the wait no longer holds them, so their readers compute them."""
    deps = wait.args[0]
    held = (*(deps if isinstance(deps, (list, tuple)) else ()), *wait.args[2:])
    return list(dict.fromkeys(n for n in held if isinstance(n, torch.fx.Node) and is_constant(n)))


def computed_after_waits(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    """Move the pure values each wait of ``gm`` holds before it to right after it, and let
    go of the constants it holds (module docstring); those nodes, in order."""
    moved: list[torch.fx.Node] = []
    for wait in [n for n in gm.graph.nodes if _is_wait(gm, n)]:
        if not _rewritable(wait):
            continue
        moving = _movable(wait)
        released = moving + _constants(wait)
        deps = wait.args[0]
        if not released or not isinstance(deps, (list, tuple)):
            continue
        if all(d in released for d in deps):
            continue  # a wait with no dependency left would order nothing: keep it wrapped
        _drop_operands(gm, wait, released)
        anchor = wait
        for node in moving:
            anchor.append(node)
            anchor = node
        moved += released
    if moved:
        gm.graph.lint()
        gm.recompile()
    return moved
