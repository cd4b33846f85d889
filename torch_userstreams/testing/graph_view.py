"""An FX graph read as a device sees it: kernels and syncs in issue order, over buffers.

Rules (each is what the executors do with the graph):

* Order: nodes are issued in graph order; a ``call_function`` kernel runs on
  ``stream_of(node)``. An unannotated node runs on the current stream: the table index
  given for its device in ``current_streams`` (so ``None`` and that index are one stream),
  else the key ``None``. A node that touches only CPU tensors under a stream that
  ``stream_devices`` says is an accelerator's runs on the host, in program order: on the
  CPU's current stream.
* Syncs: ``streams::*`` ops. A ``control_deps`` node is the sync op inside its subgraph,
  issued at the ``control_deps`` node's position; ``getitem(control_deps, i)`` for i >= 1
  aliases its (i-1)-th passthrough operand (index 0 is the sync's own result).
* Storage: a kernel's tensor output is a new buffer allocated on its stream, unless the op's
  schema says the output aliases an argument (views, in-place and ``out=`` ops); a
  ``getitem`` of a tuple output is that element's buffer. Placeholders and ``get_attr``
  constants exist, complete, before the graph starts.
* Accesses: an argument whose schema ``alias_info.is_write`` is set is written; every other
  tensor argument is read, except by view ops and metadata-only ops, which touch no data.
  Without a schema (Python callables, ``call_method``/``call_module``) every tensor argument
  is read, and a method whose name ends in ``_`` writes its ``self``.
* Collectives (``_c10d_functional``, ``c10d``): a collective reads and writes every tensor it
  is given on its stream, its result is complete only once ``wait_tensor`` ran there, and
  ``wait_tensor`` returns the very buffer it waited for.
* Host-only nodes (``getitem``, lookups, symbolic-size arithmetic) issue nothing.
* A backward graph (one that takes ``tangents_*``) runs as one autograd node on the
  current stream: the engine writes each incoming gradient there before the graph starts,
  and reads each value the graph makes and returns there after it ends.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from ..fx.control_deps import is_control_deps, sync_of
from ..fx.meta import device_of, is_tangent, stream_of
from ..fx.ops import is_sync_op, op_name, sync_args
from ..fx.subgraphs import attribute

StreamKey = int | str | None
"""A table index; ``None`` for the current stream when its index is unknown."""

COLLECTIVE_NAMESPACES = frozenset({"_c10d_functional", "c10d", "_c10d_functional_autograd"})
_METADATA_ONLY = frozenset(
    {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride", "dim"}
)


@dataclass(eq=False)
class Buffer:
    """One storage: allocated by ``producer`` on ``stream``, or an input (``producer`` None)."""

    name: str
    producer: torch.fx.Node | None
    stream: StreamKey
    position: int
    escapes: bool = False  # reaches the graph's output: the caller owns its lifetime


@dataclass(frozen=True)
class Access:
    buffer: Buffer
    write: bool


@dataclass(eq=False)
class Kernel:
    """Work issued on one stream: the data it reads and writes, the buffers it allocates."""

    node: torch.fx.Node
    position: int
    stream: StreamKey
    accesses: list[Access] = field(default_factory=list)
    allocates: list[Buffer] = field(default_factory=list)


@dataclass(eq=False)
class Sync:
    """A ``streams::*`` op; ``node`` is the graph node issuing it (maybe a control_deps)."""

    node: torch.fx.Node
    position: int
    op: Any
    args: tuple[Any, ...]

    @property
    def name(self) -> str:
        return op_name(self.op)


Step = Kernel | Sync


class _Fanout:
    """A list-valued output whose elements are made on first ``getitem``."""

    def __init__(self, make: Any) -> None:
        self.make = make
        self.items: dict[int, Any] = {}

    def item(self, index: int) -> Any:
        if index not in self.items:
            self.items[index] = self.make(index)
        return self.items[index]


@dataclass
class GraphView:
    """The steps of a graph in issue order, its buffers and where each one is released."""

    steps: list[Step]
    buffers: list[Buffer]
    release: dict[Buffer, int]  # position of the last node referencing the buffer


def _buffers_in(value: Any) -> Iterator[Buffer]:
    if isinstance(value, Buffer):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _buffers_in(item)


class _Reader:
    """Builds a ``GraphView``; one pass over the nodes, in order."""

    def __init__(
        self,
        gm: torch.fx.GraphModule,
        current_streams: Mapping[str, int],
        stream_devices: Mapping[int, str],
    ) -> None:
        self.gm = gm
        self.current_streams = current_streams
        self.stream_devices = stream_devices
        self.values: dict[torch.fx.Node, Any] = {}
        self.steps: list[Step] = []
        self.buffers: list[Buffer] = []
        self.release: dict[Buffer, int] = {}
        self.position = 0
        self.backward = False  # the graph takes tangents: the engine runs it as one node

    def read(self) -> GraphView:
        for position, node in enumerate(self.gm.graph.nodes):
            self.position = position
            for arg in node.all_input_nodes:
                for buffer in _buffers_in(self.values.get(arg)):
                    self.release[buffer] = position
            self.values[node] = self._visit(node)
        return GraphView(self.steps, self.buffers, self.release)

    # -- values -----------------------------------------------------------------------

    def stream(self, node: torch.fx.Node) -> StreamKey:
        index = stream_of(node)
        device = device_of(node)
        if index is not None and not (device.type == "cpu" and self._accelerator(index)):
            return index
        return self._current_stream(device)

    def _current_stream(self, device: torch.device) -> StreamKey:
        """The current stream of ``device``: keyed as ``cuda:0``, or by its type alone."""
        found = self.current_streams.get(str(device))
        return self.current_streams.get(device.type) if found is None else found

    def _accelerator(self, index: int) -> bool:
        return not self.stream_devices.get(index, "cpu").startswith("cpu")

    def new_buffer(self, name: str, producer: torch.fx.Node | None, stream: StreamKey) -> Buffer:
        buffer = Buffer(name, producer, stream, self.position)
        self.buffers.append(buffer)
        self.release[buffer] = self.position
        return buffer

    def value(self, arg: Any) -> Any:
        """The buffers an argument refers to (nested like the argument)."""
        if isinstance(arg, torch.fx.Node):
            return self.values.get(arg)
        if isinstance(arg, (tuple, list)):
            return tuple(self.value(item) for item in arg)
        return arg

    def _visit(self, node: torch.fx.Node) -> Any:
        if node.op in ("placeholder", "get_attr"):
            if node.op == "get_attr" and isinstance(attribute(self.gm, node), torch.nn.Module):
                return None
            buffer = self.new_buffer(node.name, None, None)
            if is_tangent(node):
                self._edge(node, buffer, write=True)
            return buffer
        if node.op == "output":
            for buffer in _buffers_in(self.value(node.args)):
                buffer.escapes = True
                if self.backward and buffer.producer is not None:
                    self._edge(buffer.producer, buffer, write=False, at=node)
            return None
        if node.op == "call_function":
            return self._call_function(node)
        return self._generic(node, write_self=node.op == "call_method" and _inplace_name(node))

    def _edge(
        self, node: torch.fx.Node, buffer: Buffer, *, write: bool, at: torch.fx.Node | None = None
    ) -> None:
        """The autograd engine's side of a backward graph, on the current stream of the
        value's device: it writes an incoming gradient before the graph starts, and reads
        each returned value after it ends."""
        self.backward = True
        stream = self._current_stream(device_of(node))
        kernel = Kernel(at or node, self.position, stream, [Access(buffer, write=write)])
        self.steps.append(kernel)

    def _call_function(self, node: torch.fx.Node) -> Any:
        target = node.target
        if target is operator.getitem:
            return self._getitem(node)
        if is_control_deps(node):
            return self._control_deps(node)
        if is_sync_op(target):
            self._sync(node, target, self.value(sync_args(node)))
            return None
        if isinstance(target, torch._ops.OpOverload):
            return self._op(node, target)
        return self._generic(node, write_self=False)

    def _getitem(self, node: torch.fx.Node) -> Any:
        base, index = self.value(node.args[0]), node.args[1]
        if isinstance(base, _Fanout) and isinstance(index, int):
            return base.item(index)
        if isinstance(base, tuple) and isinstance(index, int) and -len(base) <= index < len(base):
            return base[index]
        return base if isinstance(base, Buffer) else None  # tensor indexing: a view

    # -- syncs ------------------------------------------------------------------------

    def _sync(self, node: torch.fx.Node, op: Any, args: tuple[Any, ...]) -> None:
        self.steps.append(Sync(node, self.position, op, tuple(args)))

    def _control_deps(self, node: torch.fx.Node) -> Any:
        sync = sync_of(self.gm, node)
        if sync is not None:
            self._sync(node, sync.op, self.value(sync.args))
        return (None, *(self.value(arg) for arg in node.args[2:]))

    # -- kernels ----------------------------------------------------------------------

    def _kernel(self, node: torch.fx.Node) -> Kernel:
        kernel = Kernel(node, self.position, self.stream(node))
        self.steps.append(kernel)
        return kernel

    def _allocate(self, kernel: Kernel, name: str) -> Buffer:
        buffer = self.new_buffer(name, kernel.node, kernel.stream)
        kernel.allocates.append(buffer)
        kernel.accesses.append(Access(buffer, write=True))
        return buffer

    def _generic(self, node: torch.fx.Node, *, write_self: bool) -> Any:
        """No schema: every tensor argument is read (``self`` written by an in-place method)."""
        args = [self.value(arg) for arg in (*node.args, *node.kwargs.values())]
        inputs = [buffer for arg in args for buffer in _buffers_in(arg)]
        meta = node.meta.get("val")
        if not inputs and not _is_tensor_like(meta, default=False):
            return None  # host-only: lookups, symbolic arithmetic, factories of non-tensors
        kernel = self._kernel(node)
        written = next(_buffers_in(args[0]), None) if write_self and args else None
        for buffer in inputs:
            kernel.accesses.append(Access(buffer, write=buffer is written))
        if written is not None:
            return written
        return self._fresh_outputs(kernel, meta)

    def _fresh_outputs(self, kernel: Kernel, meta: Any) -> Any:
        name = kernel.node.name
        if isinstance(meta, (tuple, list)):
            return tuple(
                self._allocate(kernel, f"{name}[{i}]")
                if _is_tensor_like(m, default=False)
                else None
                for i, m in enumerate(meta)
            )
        if _is_tensor_like(meta, default=True):
            return self._allocate(kernel, name)
        return None

    def _op(self, node: torch.fx.Node, op: torch._ops.OpOverload) -> Any:
        schema = op._schema
        if op.overloadpacket.__name__ in _METADATA_ONLY:
            return None
        bound = _bind_schema(schema, node, self.value)
        aliased = {
            alias_set: value
            for argument, value in bound
            if argument.alias_info is not None
            for alias_set in argument.alias_info.before_set
        }
        collective = op.namespace in COLLECTIVE_NAMESPACES
        writes = {
            id(b)
            for argument, value in bound
            if collective or (argument.alias_info is not None and argument.alias_info.is_write)
            for b in _buffers_in(value)
        }
        is_view = any(r.alias_info is not None for r in schema.returns) and not writes
        inputs = [b for _, value in bound for b in _buffers_in(value)]
        if is_view:
            kernel = None
        elif not inputs and not any(_returns_tensor(r) for r in schema.returns):
            return None
        else:
            kernel = self._kernel(node)
            for buffer in dict.fromkeys(inputs):
                kernel.accesses.append(Access(buffer, write=id(buffer) in writes))
        if collective and op.overloadpacket.__name__ == "wait_tensor":
            return inputs[0] if inputs else None
        outputs = [self._output(kernel, node, r, i, aliased) for i, r in enumerate(schema.returns)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _output(
        self, kernel: Kernel | None, node: torch.fx.Node, ret: Any, index: int, aliased: dict
    ) -> Any:
        if ret.alias_info is not None:
            for alias_set in ret.alias_info.before_set:
                if alias_set in aliased:
                    return _alias_of(aliased[alias_set])
        if kernel is None or not _returns_tensor(ret):
            return None
        suffix = "" if len(node.target._schema.returns) == 1 else f"[{index}]"  # type: ignore[union-attr]
        if isinstance(ret.type, torch.ListType):
            return _Fanout(lambda i: self._allocate(kernel, f"{node.name}{suffix}[{i}]"))
        return self._allocate(kernel, f"{node.name}{suffix}")


def _alias_of(value: Any) -> Any:
    """A view of a list of tensors aliases each of them; of one tensor, that tensor."""
    if isinstance(value, tuple):
        buffers = list(_buffers_in(value))
        return _Fanout(lambda i: buffers[i] if i < len(buffers) else None)
    return value


def _returns_tensor(ret: Any) -> bool:
    kind = ret.type
    if isinstance(kind, torch.OptionalType):
        kind = kind.getElementType()
    if isinstance(kind, torch.ListType):
        kind = kind.getElementType()
    return isinstance(kind, torch.TensorType)


def _is_tensor_like(meta: Any, *, default: bool) -> bool:
    if meta is None:
        return default
    return isinstance(meta, torch.Tensor)


def _inplace_name(node: torch.fx.Node) -> bool:
    name = str(node.target)
    return name.endswith("_") and not name.endswith("__")


def _bind_schema(schema: Any, node: torch.fx.Node, value: Any) -> list[tuple[Any, Any]]:
    """Pairs each schema argument with the value the node passes for it."""
    bound = []
    for i, argument in enumerate(schema.arguments):
        if i < len(node.args) and not argument.kwarg_only:
            bound.append((argument, value(node.args[i])))
        elif argument.name in node.kwargs:
            bound.append((argument, value(node.kwargs[argument.name])))
    return bound


def read_graph(
    gm: torch.fx.GraphModule,
    current_streams: Mapping[str, int] | None = None,
    stream_devices: Mapping[int, str] | None = None,
) -> GraphView:
    """Read ``gm`` as kernels and syncs (see the module docstring for the rules)."""
    return _Reader(gm, current_streams or {}, stream_devices or {}).read()
