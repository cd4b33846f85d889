"""Run an FX graph node by node, each on the stream its annotation names.

Native ``aot_eager`` ignores stream annotations (everything runs on the current stream), so
it cannot show stream bugs. This executor enters each node's stream (resolved through the
current call's binding) around that node, and runs the sync nodes as they are.

The graph is read once, at compile time, into a plan of steps; each call evaluates the plan
with values of its own (nothing per call is stored on the plan, so calls on several
threads do not meet), and drops each value after its last use, as eager code would.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

from .passes.annotations import stream_of
from .runtime import lookup


@dataclass(frozen=True)
class _Step:
    """One node: how to call it, on which stream, and which values die after it."""

    slot: int
    call: Callable[..., Any]
    args: tuple[Any, ...]  # nested; an ``_Ref`` stands for an earlier node's value
    kwargs: dict[str, Any]
    stream: int | None
    frees: tuple[int, ...]


@dataclass(frozen=True)
class _Ref:
    slot: int


def _method_caller(name: str) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self, name)(*args, **kwargs)

    return call


def _constant(value: Any) -> Callable[[], Any]:
    return lambda: value


class _Plan:
    """The steps of a graph module, its placeholders' slots and its output template."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        nodes = list(gm.graph.nodes)
        slots = {node: i for i, node in enumerate(nodes)}
        dies_at = _deaths(nodes, slots)

        def ref(arg: Any) -> Any:
            return torch.fx.map_arg(arg, lambda n: _Ref(slots[n]))  # type: ignore[arg-type,return-value]

        self.size = len(nodes)
        self.inputs = [slots[n] for n in nodes if n.op == "placeholder"]
        self.output: Any = None
        self.steps: list[_Step] = []
        for node in nodes:
            if node.op == "output":
                self.output = ref(node.args[0])
            elif node.op != "placeholder":
                stream = stream_of(node) if node.op == "call_function" else None
                self.steps.append(
                    _Step(
                        slots[node],
                        _callable(gm, node),
                        ref(node.args),
                        ref(dict(node.kwargs)),
                        stream,
                        tuple(dies_at.get(node, ())),
                    )
                )

    def run(self, inputs: list[Any]) -> Any:
        values: list[Any] = [None] * self.size
        for slot, value in zip(self.inputs, inputs, strict=True):
            values[slot] = value
        for step in self.steps:
            args = _load(step.args, values)
            kwargs = _load(step.kwargs, values)
            if step.stream is None:
                values[step.slot] = step.call(*args, **kwargs)
            else:
                with lookup(step.stream):
                    values[step.slot] = step.call(*args, **kwargs)
            for slot in step.frees:
                values[slot] = None
        return _load(self.output, values)


def _deaths(nodes: list[torch.fx.Node], slots: dict[torch.fx.Node, int]) -> dict[Any, list[int]]:
    """node -> the slots of the values whose last use it is (dropped right after it)."""
    last_use: dict[torch.fx.Node, torch.fx.Node] = {}
    for node in nodes:
        for used in node.all_input_nodes:
            last_use[used] = node
    dies_at: dict[Any, list[int]] = {}
    for value, user in last_use.items():
        dies_at.setdefault(user, []).append(slots[value])
    return dies_at


def _callable(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Callable[..., Any]:
    if node.op == "call_function":
        return node.target  # type: ignore[return-value]
    if node.op == "call_method":
        return _method_caller(str(node.target))
    if node.op == "get_attr":
        return _constant(_attr(gm, str(node.target)))
    raise NotImplementedError(
        f"torch_userstreams: the stream executor cannot run {node.op} node {node.name}; "
        "graphs from AOTAutograd have none."
    )


def _attr(gm: torch.nn.Module, target: str) -> Any:
    value: Any = gm
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _load(template: Any, values: list[Any]) -> Any:
    """``template`` with each ``_Ref`` replaced by its value (FX's containers included)."""
    if type(template) is _Ref:
        return values[template.slot]
    if isinstance(template, tuple):
        return tuple(_load(item, values) for item in template)
    if isinstance(template, list):
        return [_load(item, values) for item in template]
    if isinstance(template, dict):
        return {key: _load(item, values) for key, item in template.items()}
    return template


def compile_with_streams(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
    """An AOTAutograd forward/backward compiler: a boxed callable over the graph's plan."""
    plan = _Plan(gm)

    def run(args: list[Any]) -> Any:
        inputs = list(args)
        args.clear()  # boxed calling convention: the callee owns the inputs
        return plan.run(inputs)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run
