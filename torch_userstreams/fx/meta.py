"""Node metadata: the stream a node runs on, its phase, the partitioner's tags, pass records.

* Stream: where Dynamo puts it, ``node.meta["custom"]["stream"]``, an index into the graph's
  user-object table; no annotation means the current stream.
* Phase: AOTAutograd tags backward nodes (``partitioner_tag``); the partitioner keeps a node
  tagged ``must_be_in_forward`` / ``must_be_in_backward`` in that graph.
* Records: what the package's passes changed on a node, under ``meta["torch_userstreams"]``,
  so that ``explain()`` and tests can tell which pass added each sync and why.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

CUSTOM = "custom"
STREAM = "stream"
PARTITIONER_TAG = "partitioner_tag"
IS_FORWARD = "is_forward"
IS_BACKWARD = "is_backward"
BACKWARD_TAGS = (IS_BACKWARD, "must_be_in_backward")
MUST_BE_IN_FORWARD = "must_be_in_forward"
MUST_BE_IN_BACKWARD = "must_be_in_backward"
GRADIENT_ACCUMULATION = "is_gradient_acc"
SEQ_NR = "seq_nr"
RECORDS = "torch_userstreams"


def stream_of(node: torch.fx.Node) -> int | None:
    """The table index of the stream ``node`` runs on, or None for the current stream."""
    custom = node.meta.get(CUSTOM)
    if isinstance(custom, dict):
        index = custom.get(STREAM)
        if index is None or type(index) is int:
            return index
        raise _not_an_index(node, index)
    return None


def _not_an_index(node: torch.fx.Node, index: object) -> Exception:
    """A stream annotation that is not a table index (a backend wrote ``"1"`` or a tensor):
    read as the current stream, the node would silently run on the wrong stream."""
    from ..errors import UserObjectError

    return UserObjectError(
        f"torch_userstreams: node {node.name} ({node.format_node()}) is annotated to run on "
        f"stream {index!r} ({type(index).__name__}), which is not a table index: annotate "
        "it with the int that new_stream() or current_stream() returned."
    )


def drop_leaked_stream_annotation() -> object | None:
    """Drop the stream annotation of the ambient trace state; return it, or None if unset.

    Dynamo enters ``with stream:`` by running ``fx.traceback.annotate({"stream": i})`` for
    real, and exits it when the trace cleans up. A trace that fails inside without exiting
    (upstream Dynamo's "multiple exits?" on ``with s1: with s2: with s1:`` did, before
    ``patch.stream_blocks`` made that a graph break) leaves it set, and every node of every
    later trace, Dynamo's or ``make_fx``'s, would run on stream ``i``."""
    from torch.fx import traceback as fx_traceback

    custom = fx_traceback.current_meta.get(CUSTOM)
    if isinstance(custom, dict) and STREAM in custom:
        return custom.pop(STREAM)  # type: ignore[no-any-return]
    return None


def set_stream(node: torch.fx.Node, index: int) -> None:
    """Annotate ``node`` with stream ``index``, in a ``custom`` dict of its own: a node
    copied with ``node_copy`` shares its original's dict, which must keep its stream."""
    custom = node.meta.get(CUSTOM)
    node.meta[CUSTOM] = {**custom, STREAM: index} if isinstance(custom, dict) else {STREAM: index}


def drop_stream(node: torch.fx.Node) -> torch.fx.Node:
    """Remove ``node``'s stream annotation; ``node`` is a copy whose meta is shallow."""
    custom = node.meta.get(CUSTOM)
    if isinstance(custom, dict) and STREAM in custom:
        node.meta[CUSTOM] = {k: v for k, v in custom.items() if k != STREAM}
    return node


def is_backward(node: torch.fx.Node) -> bool:
    return node.meta.get(PARTITIONER_TAG) in BACKWARD_TAGS


def is_tangent(node: torch.fx.Node) -> bool:
    """Whether ``node`` is an incoming gradient of a joint graph (AOTAutograd's naming)."""
    return node.op == "placeholder" and "tangents" in str(node.target)


def is_gradient_accumulation(node: torch.fx.Node) -> bool:
    return bool(node.meta.get(GRADIENT_ACCUMULATION, False))


# gm.meta key: whether a graph the backend compiles is a backward (AOTAutograd says so in
# the compiler's arguments; the passes that run on each compiled graph read it here).
BACKWARD_GRAPH = "torch_userstreams.backward_graph"


def mark_graph_phase(gm: torch.fx.GraphModule, *, backward: bool) -> None:
    gm.meta[BACKWARD_GRAPH] = backward


def is_backward_graph(gm: torch.fx.GraphModule) -> bool:
    return bool(gm.meta.get(BACKWARD_GRAPH, False))


def mark_phase(node: torch.fx.Node, backward: bool) -> None:
    """Keep ``node`` in its phase's graph when partitioned. Forward syncs need it too: a sync
    names only table indices, so the partitioner would copy it into the backward graph (and
    save its ``control_deps`` wrapper there, which holds no tensor)."""
    node.meta[PARTITIONER_TAG] = MUST_BE_IN_BACKWARD if backward else MUST_BE_IN_FORWARD


@dataclass(frozen=True)
class PassRecord:
    """One change a pass made to a node (or the node it created)."""

    pass_name: str
    note: str

    def __str__(self) -> str:
        return f"{self.pass_name}: {self.note}"


def record(node: torch.fx.Node, pass_name: str, note: str) -> PassRecord:
    """Remember on ``node`` what a pass did; returns the record (for the pass's result).
    The list is the node's own: ``node_copy`` shares its original's."""
    entry = PassRecord(pass_name, note)
    node.meta[RECORDS] = [*node.meta.get(RECORDS, ()), entry]
    return entry


def records(node: torch.fx.Node) -> list[PassRecord]:
    return list(node.meta.get(RECORDS, ()))


def tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


# Where the package takes CPU tensors to live, for its decisions only (which syncs a pass
# places, which buffers need one): None means where they are. Set by
# ``testing.fake_accelerator(gpu_semantics=True)`` for the compiles inside it.
_HOST_TENSORS_AS: ContextVar[torch.device | None] = ContextVar(
    "torch_userstreams.host_tensors_as", default=None
)


@contextlib.contextmanager
def host_tensors_as(device: torch.device) -> Iterator[None]:
    """Inside, every CPU tensor counts as a ``device`` tensor for the package's decisions,
    so that graphs compiled on CPU get the syncs a graph on ``device`` would get. Tensors
    and the code that computes them stay on the CPU."""
    token = _HOST_TENSORS_AS.set(device)
    try:
        yield
    finally:
        _HOST_TENSORS_AS.reset(token)


def tensor_device(tensor: torch.Tensor) -> torch.device:
    """The device the package takes ``tensor`` to live on (see ``host_tensors_as``)."""
    device = tensor.device
    if device.type == "cpu":
        return _HOST_TENSORS_AS.get() or device
    return device


def device_of(node: torch.fx.Node) -> torch.device:
    """The device a node's work runs on: an accelerator if any tensor it touches lives there.

    A copy between CPU and an accelerator is issued on the accelerator's stream, whichever
    side its output is on; CPU-only work runs on the host, in program order.
    """
    touched = (node, *node.all_input_nodes)
    devices = [tensor_device(t) for n in touched for t in tensors(n.meta.get("val"))]
    return next((d for d in devices if d.type != "cpu"), torch.device("cpu"))


_FRAME = re.compile(r'^File "(?P<path>.*)", line (?P<line>\d+), in (?P<function>.*)$')


def user_frame(node: torch.fx.Node) -> tuple[str, str] | None:
    """(``file:line in function``, the line's code or '') of the innermost frame in
    ``node``'s stack trace: the user's code that made it; None without a trace."""
    lines = [line.strip() for line in (node.meta.get("stack_trace") or "").splitlines()]
    for i in reversed(range(len(lines))):
        frame = _FRAME.match(lines[i])
        if frame:
            code = lines[i + 1] if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) else ""
            return f"{frame['path']}:{frame['line']} in {frame['function']}", code
    return None
