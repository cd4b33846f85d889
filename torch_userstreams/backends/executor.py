"""Run an FX graph node by node, each on the stream its annotation names.

Native ``aot_eager`` ignores stream annotations (everything runs on the current stream), so
it cannot show stream bugs. This executor is the debugging backend's compiler: one ``plan``
step per node, entered on the node's stream (resolved through the current call's binding),
and one step per sync, issued against the call's objects (``issue_syncs``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from ..fx.control_deps import alias_of, sync_of
from ..fx.meta import stream_of
from ..fx.subgraphs import attribute
from ..run.issue_syncs import issuer
from ..run.plan import Program, Ref, Step


def _method_caller(name: str) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, name)(*args, **kwargs)

    return call


def _constant(value: Any) -> Callable[[], Any]:
    return lambda: value


def _callable(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Callable[..., Any]:
    if node.op == "call_function":
        return node.target  # type: ignore[return-value]
    if node.op == "call_method":
        return _method_caller(str(node.target))
    if node.op == "get_attr":
        return _constant(attribute(gm, node, required=True))
    raise NotImplementedError(
        f"torch_userstreams: the stream executor cannot run {node.op} node {node.name}; "
        "graphs from AOTAutograd have none."
    )


def _ref(slots: dict[torch.fx.Node, int], node: torch.fx.Node) -> Ref | None:
    value = alias_of(node)
    return None if value is None else Ref(slots[value])


def node_program(gm: torch.fx.GraphModule) -> Program:
    """One step per node of ``gm``; a ``control_deps`` passthrough reads its operand."""
    slots = {node: i for i, node in enumerate(gm.graph.nodes)}

    def ref(arg: Any) -> Any:
        return torch.fx.map_arg(arg, lambda n: _ref(slots, n))  # type: ignore[arg-type,return-value]

    steps: list[Step] = []
    output: Any = None
    for node in gm.graph.nodes:
        if node.op == "placeholder" or alias_of(node) is not node:
            continue
        sync = sync_of(gm, node)
        if node.op == "output":
            output = ref(node.args[0])
        elif sync is not None:
            steps.append(Step(issuer(sync.op), ref(sync.args), output=slots[node]))
        else:
            stream = stream_of(node) if node.op == "call_function" else None
            call = _callable(gm, node)
            steps.append(
                Step(call, ref(node.args), ref(dict(node.kwargs)), stream, output=slots[node])
            )
    inputs = [slots[n] for n in gm.graph.nodes if n.op == "placeholder"]
    return Program(len(slots), inputs, steps, output)


def compile_with_streams(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
    """An AOTAutograd forward (or inference) compiler: a boxed callable over the graph's
    steps."""
    return node_program(gm).boxed()


def compile_backward_with_streams(
    gm: torch.fx.GraphModule, example_inputs: Any
) -> Callable[..., Any]:
    """An AOTAutograd backward compiler: as ``compile_with_streams``, run with the binding
    of the node that runs it."""
    return node_program(gm).boxed(backward=True)
