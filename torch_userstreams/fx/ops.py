"""The sync ops compiled graphs contain.

Dynamo and AOTAutograd express every stream sync as a ``streams::*`` custom op whose integer
arguments are indices into the graph's user-object table; where torch lacks one, the package
emits its own, in the ``userstreams`` namespace (``run/own_ops.py``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

NAMESPACE = "streams"
OWN_NAMESPACE = "userstreams"
_NAMESPACES = frozenset({NAMESPACE, OWN_NAMESPACE})


def is_sync_op(target: Any) -> bool:
    """Whether an FX node target is a stream sync op (``streams::*`` or the package's): an
    overload (``torch.ops.streams.record_event.default``, in AOTAutograd's graphs) or the
    packet (``torch.ops.streams.record_event``, as Dynamo writes syncs). A packet has no
    ``namespace``; its qualified name starts with it."""
    namespace = getattr(target, "namespace", None)
    if namespace is None:
        qualified = getattr(target, "_qualified_op_name", None)
        namespace = qualified.split("::", 1)[0] if isinstance(qualified, str) else None
    return namespace in _NAMESPACES


def _schema(target: Any) -> Any:
    """The schema of an overload, or of a packet's default overload; None without one."""
    return getattr(target, "_schema", None) or getattr(
        getattr(target, "default", None), "_schema", None
    )


def sync_args(node: torch.fx.Node) -> tuple[Any, ...]:
    """A sync node's arguments in schema order, those given by keyword included (a backend
    may write ``record_event(event_index=..., stream_index=...)``)."""
    if not node.kwargs:
        return tuple(node.args)
    schema = _schema(node.target)
    if schema is None:
        return (*node.args, *node.kwargs.values())
    names = [argument.name for argument in schema.arguments[len(node.args) :]]
    return (*node.args, *(node.kwargs[name] for name in names if name in node.kwargs))


# Each sync op's positional arguments by what they name: the one table of their positions.
# ``stream`` is the stream the op acts on (records on, waits on, holds memory for, or, for
# ``wait_stream``, the waiting one); ``waited`` is the stream ``wait_stream`` waits for.
SYNC_ROLES: dict[str, tuple[str, ...]] = {
    "record_event": ("event", "stream"),
    "wait_event": ("event", "stream"),
    "sync_dealloc": ("event", "stream", "tensor"),
    "wait_stream": ("stream", "waited"),
    "record_stream": ("tensor", "stream"),
    "synchronize_event": ("event",),
    "synchronize_stream": ("stream",),
    "synchronize_device": ("device_type", "device"),
}
# The roles that name a user object (a table index in compiled graphs).
OBJECT_ROLES = frozenset({"event", "stream", "waited"})
# Each sync written as a method call on the call's own objects, its arguments named by role:
# how generated code issues it without the op's dispatch.
SYNC_METHODS: dict[str, str] = {
    "record_event": "{event}.record({stream})",
    "wait_event": "{event}.wait({stream})",
    "wait_stream": "{stream}.wait_stream({waited})",
    # the tensor is held until here: its memory is not reused before the wait
    "sync_dealloc": "{event}.wait({stream})",
    "synchronize_event": "{event}.synchronize()",
    "synchronize_stream": "{stream}.synchronize()",
    "record_stream": "{tensor}.record_stream({stream})",
}


@dataclass(frozen=True)
class SyncOperands:
    """A sync's arguments by role (``SYNC_ROLES``); None for a role the op does not have or
    the call left out."""

    event: Any = None
    stream: Any = None
    waited: Any = None
    tensor: Any = None


def operands(name: str, args: tuple[Any, ...]) -> SyncOperands:
    """The arguments ``args`` of the sync op ``name`` (``op_name``) by role."""
    roles = SYNC_ROLES.get(name, ())
    fields = SyncOperands.__dataclass_fields__
    return SyncOperands(
        **{role: arg for role, arg in zip(roles, args, strict=False) if role in fields}
    )


def table_indices(node: torch.fx.Node) -> list[int]:
    """The user-object table indices a sync node names: its ``*_index`` arguments, but not
    ``synchronize_device``'s ``device_index``, which names a device."""
    args = sync_args(node)
    schema = _schema(node.target)
    if schema is None:
        return [arg for arg in args if type(arg) is int]
    return [
        arg
        for arg, argument in zip(args, schema.arguments, strict=False)
        if type(arg) is int and argument.name.endswith("_index") and argument.name != "device_index"
    ]


def op_name(target: Any) -> str:
    """``record_event`` for ``torch.ops.streams.record_event`` (the overload or its packet)."""
    name = getattr(target, "_opname", None) or getattr(target, "_qualified_op_name", None)
    return str(name or target).rsplit("::", 1)[-1]


def is_view(node: torch.fx.Node) -> bool:
    """Whether ``node``'s op returns a view of an input (it computes nothing of its own); a
    ``getitem`` of a multi-output view (``split``, ``chunk``, ``unbind``) is one too."""
    target = node.target
    if target is operator.getitem:
        source = node.args[0]
        return (
            isinstance(source, torch.fx.Node) and source.op == "call_function" and (is_view(source))
        )
    if not isinstance(target, torch._ops.OpOverload):
        return False
    returns = target._schema.returns
    return any(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def is_constant(node: torch.fx.Node) -> bool:
    """A value that reads nothing and has no effect (``full``, or an allocation such as
    ``empty``): no sync orders it, so wherever its readers run, they read the same."""
    target = node.target
    return (
        node.op == "call_function"
        and not node.all_input_nodes
        and isinstance(target, torch._ops.OpOverload)
        and target.namespace == "aten"  # (a sync reads no node either)
        and not target._schema.is_mutable
        and torch.Tag.nondeterministic_seeded not in target.tags
        and target not in torch.fx.node._side_effectful_functions
    )


def made_by(node: torch.fx.Node) -> torch.fx.Node:
    """The node that computed ``node``'s data: a view reads its base's (and the partitioner
    recomputes views freely, whatever their tag)."""
    while node.op == "call_function" and is_view(node) and node.all_input_nodes:
        node = node.all_input_nodes[0]
    return node


def native_op(name: str) -> Any | None:
    """``torch.ops.streams.<name>.default``, or None where this torch lacks it."""
    import torch._dynamo.variables.streams  # defines the ops

    try:
        return getattr(torch.ops.streams, name).default
    except AttributeError:
        return None


_LOOKUPS = frozenset(
    {
        ("torch_userstreams.run.lookup", "lookup"),  # the package's
        ("torch._dynamo.graph_bytecode_inputs", "get_external_object_by_index"),  # native's
    }
)


def is_lookup(target: Any) -> bool:
    """Whether an FX node target reads a user object by index (the package's or native's)."""
    key = (getattr(target, "__module__", None), getattr(target, "__name__", None))
    return key in _LOOKUPS
