"""Inductor 2.11 runs every kernel of a graph on one stream; while installed, the package
places each node of a graph with user streams its backend compiles as one call on its
stream (``PLACED``), as Inductor 2.12+ does itself.

* A node's stream is the annotation of the FX node whose lowering made its buffer (its
  ``origin_node``; else the last of its origins in graph order). A pointwise value Inductor
  computes inside the kernel of a later node that reads it runs where that reader runs, as
  on 2.12+; what a sync must follow, and a value another stream reads, is computed first
  (``wrap_run_node``).
* No two nodes of different streams are fused into one kernel (``wrap_can_fuse``).
* The code enters a stream's block before a node of another stream than the one open
  (``StreamBlocks``), with what the scheduler gathered flushed first. A block is left
  before a device guard is entered or left, and entered again inside or after it, so the
  two nest; 2.11 writes ``get_raw_stream`` before each kernel it launches, so a kernel
  inside a block launches on the block's stream. A sync, or a node that runs nothing,
  stays in the block open: a sync names the streams it acts on.

Each block is a line of the package's (``wrapper_lines.block_lines``), numbered
as Inductor 2.12+ numbers its own (0 the stream the call began on, 1, 2... each side
stream in order of first use), so ``inductor.launch_code`` and ``inductor.sync_lines`` read
and rewrite 2.11's code as they do 2.12's. A block writes ``with user_objectN:``, the
name ``launch_code`` defines for table index N: 2.11 names a device's raw stream
``streamN`` (device N), which a block named so would be overwritten by.

Inductor computes a pointwise value where a later node reads it. 2.12+ computes the values a
sync is wrapped to follow (``control_deps``) before it, and a value read on another stream on
its own; torch 2.11 does neither, so there, in a graph the package places on its streams
(``PLACED``), every value lowered before a sync that a node after it reads is computed into
a buffer before the sync is lowered, and a value is computed on its own stream
before a node of another stream reads it (``wrap_run_node``): what the graph does before a
sync runs before it, on the stream the user put it on, as in a region.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from ..fx.meta import stream_of
from ..fx.ops import is_constant, is_sync_op
from ..originals import carries, shadowed
from .sync_order import is_sync
from .wrapper_lines import block_lines, writes_no_code

CanFuse = Callable[..., bool]
RunNode = Callable[[Any, Any], Any]
# Set in the meta of a graph the package's backend compiles as one call on 2.11: only such a
# graph is placed on its streams, under the config that keeps them apart (no buffer reuse,
# no reordering for locality, ``backends.inductor_graphs``). Native ``backend="inductor"``
# keeps 2.11's one stream, where its buffer reuse and reordering are safe.
PLACED = "torch_userstreams.placed_streams"


def placing(module: Any) -> bool:
    """Whether the package places the nodes of ``module``, the graph Inductor lowers."""
    return bool(getattr(module, "meta", {}).get(PLACED))


def stream_index(node: Any) -> int | None:
    """The table index of the stream a scheduler node runs on (None: the stream the call
    began on); a fused node's parts share one (``wrap_can_fuse``)."""
    for part in node.get_nodes():
        operation = getattr(part, "node", None)
        if operation is None:
            continue
        origin = getattr(operation, "origin_node", None)
        if origin is None:
            origins = operation.get_origins()
            origin = max(origins) if origins else None
        if origin is not None:
            return stream_of(origin)
    return None


def runs_nothing(node: Any) -> bool:
    """Whether a scheduler node launches no work of its own on a stream: a sync (it names
    the streams it acts on) or a node Inductor writes no kernel for."""
    from torch._inductor.scheduler import NopKernelSchedulerNode

    return isinstance(node, NopKernelSchedulerNode) or is_sync(getattr(node, "node", None))


def numbered(nodes: list[Any]) -> dict[int, int]:
    """Inductor's numbering of the side streams ``nodes`` run on: number -> table index."""
    numbers: dict[int, int] = {}
    for node in nodes:
        index = stream_index(node)
        if index is not None and not runs_nothing(node) and index not in numbers.values():
            numbers[len(numbers) + 1] = index
    return numbers


def wrap_can_fuse(native: CanFuse) -> CanFuse:
    """The replacement of ``Scheduler.can_fuse``: two nodes of different streams are not
    fused (a kernel runs on one stream)."""

    @carries(native)
    def can_fuse(self: Any, node1: Any, node2: Any, *args: Any, **kwargs: Any) -> bool:
        from torch._inductor.virtualized import V

        if placing(V.graph.module) and stream_index(node1) != stream_index(node2):
            return False
        return native(self, node1, node2, *args, **kwargs)

    return can_fuse


class StreamBlocks:
    """The stream blocks of one graph's code as the scheduler writes it (module docstring)."""

    def __init__(self, scheduler: Any, wrapper: Any, numbers: dict[int, int]) -> None:
        self.scheduler = scheduler
        self.wrapper = wrapper
        self.number_of = {index: number for number, index in numbers.items()}
        self.open: int | None = None  # the table index of the block open
        self.entered_at = 0  # where its enter line is in the wrapper's lines

    def before(self, node: Any) -> None:
        if runs_nothing(node):
            return
        index = stream_index(node)
        if index != self.open:
            self.scheduler.flush()
            self.leave()
            self.enter(index)

    def enter(self, index: int | None) -> None:
        if index is not None:
            enter, _ = block_lines()
            self.entered_at = len(self.wrapper.lines)
            self.wrapper.writeline(enter(self.number_of[index], index))
        self.open = index

    def leave(self) -> None:
        """Close the block open; a block that wrote no code is taken out instead."""
        if self.open is None:
            return
        _, leave = block_lines()
        lines = self.wrapper.lines
        if all(map(writes_no_code, lines[self.entered_at + 1 :])):
            del lines[self.entered_at]
        else:
            lines.append(leave())
        self.open = None

    @contextlib.contextmanager
    def around_guards(self) -> Iterator[None]:
        """While the scheduler writes its code: each device guard entered and left outside
        a block, the block open entered again after it."""
        native_enter = self.wrapper.codegen_device_guard_enter
        native_exit = self.wrapper.codegen_device_guard_exit
        native_context = self.scheduler.enter_context

        def guarded(native: Callable[..., None]) -> Callable[..., None]:
            def write(*args: Any) -> None:
                index = self.open
                self.leave()
                native(*args)
                self.enter(index)

            return write

        def enter_context(node: Any) -> None:
            self.before(node)
            native_context(node)

        with (
            shadowed(
                self.wrapper,
                {
                    "codegen_device_guard_enter": guarded(native_enter),
                    "codegen_device_guard_exit": guarded(native_exit),
                },
            ),
            shadowed(self.scheduler, {"enter_context": enter_context}),
        ):
            yield
            self.scheduler.flush()
            self.leave()


def wrap_run_node(native: RunNode) -> RunNode:
    """The replacement of ``GraphLowering.run_node`` (2.11, a graph the package places on its
    streams, ``PLACED``): before a sync is lowered, each value lowered before it that a later
    node reads is realized; before any other node, each value it reads that another stream
    made (module docstring)."""

    @carries(native)
    def run_node(self: Any, n: Any) -> Any:
        if not placing(self.module):
            return native(self, n)
        if is_sync_op(getattr(n, "target", None)):
            settled = self.__dict__.setdefault(_SETTLED, set())
            _realize_what_later_nodes_read(self.env, settled)
        elif n.op == "call_function":
            _realize_what_another_stream_made(n, self.env)
        return native(self, n)

    return run_node


# On the ``GraphLowering`` placing a graph: the nodes an earlier sync settled (computed into
# a buffer, or read by no node lowered after it). A value's buffer stays, and a node read
# only by nodes already lowered is never read later, so no later sync looks at them again.
_SETTLED = "_torch_userstreams_settled"


def _realize_what_later_nodes_read(env: dict[Any, Any], settled: set[Any]) -> None:
    """Before a sync, what a later node reads; not a constant (``full``): its readers
    compute it inside their own kernels, after the sync, as Inductor does without streams,
    rather than in a kernel of its own before it. ``settled``: the nodes an earlier sync of
    the graph looked at, which this one skips (it adds the ones it looks at)."""
    for node, value in env.items():
        if node in settled:
            continue
        settled.add(node)
        if any(user not in env for user in node.users) and not is_constant(node):
            _realize(value)


def _realize_what_another_stream_made(node: Any, env: dict[Any, Any]) -> None:
    stream = stream_of(node)
    for read in node.all_input_nodes:
        if read in env and stream_of(read) != stream:
            _realize(env[read])


def _realize(value: Any) -> None:
    from torch._inductor import ir
    from torch.utils._pytree import tree_leaves

    for leaf in tree_leaves(value):
        if isinstance(leaf, ir.TensorBox):
            leaf.realize()
