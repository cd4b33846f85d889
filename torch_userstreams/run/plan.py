"""A compiled graph as a list of steps the host issues in order, each on its stream.

Both package backends run graphs this way: ``userstreams_aot_eager`` one step per node,
``userstreams`` one step per Inductor-compiled stream region, and both one step per sync.
A ``Program`` is built once per compile; each call evaluates it with values of its own
(nothing per call lives on the program, so calls on several threads do not meet) and drops
every value after its last use, as eager code would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..observe import watcher
from .backward import running_node_binding
from .issue_syncs import diagnose
from .lookup import lookup
from .state import state


@dataclass(frozen=True)
class Ref:
    """Stands for the value in ``slot`` inside an argument template."""

    slot: int


@dataclass(frozen=True)
class Step:
    """Call ``call(*args, **kwargs)`` on ``stream`` (None: as is); store the result in
    ``output`` (a slot), or unpack it into ``outputs``; then drop the slots in ``frees``."""

    call: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] | None = None
    stream: int | None = None
    output: int | None = None
    outputs: tuple[int, ...] = ()
    frees: tuple[int, ...] = ()


def load(template: Any, values: list[Any]) -> Any:
    """``template`` with each ``Ref`` replaced by its value (FX's containers included)."""
    if type(template) is Ref:
        return values[template.slot]
    if isinstance(template, tuple):
        return tuple(load(item, values) for item in template)
    if isinstance(template, list):
        return [load(item, values) for item in template]
    if isinstance(template, dict):
        return {key: load(item, values) for key, item in template.items()}
    return template


def refs(template: Any) -> Iterator[int]:
    """The slots a template reads."""
    if type(template) is Ref:
        yield template.slot
    elif isinstance(template, (tuple, list)):
        for item in template:
            yield from refs(item)
    elif isinstance(template, dict):
        for item in template.values():
            yield from refs(item)


class Program:
    """Steps over ``size`` value slots; ``inputs`` are the slots of the graph's inputs."""

    def __init__(self, size: int, inputs: list[int], steps: list[Step], output: Any) -> None:
        self.size = size
        self.inputs = inputs
        self.output = output
        self.steps = _with_frees(steps, set(refs(output)))

    def run(self, inputs: list[Any]) -> Any:
        values: list[Any] = [None] * self.size
        for slot, value in zip(self.inputs, inputs, strict=True):
            values[slot] = value
        step = None
        try:
            for step in self.steps:
                args = load(step.args, values)
                kwargs = load(step.kwargs, values) if step.kwargs else {}
                if step.stream is None:
                    result = step.call(*args, **kwargs)
                else:
                    with lookup(step.stream):
                        result = step.call(*args, **kwargs)
                if step.output is not None:
                    values[step.output] = result
                elif step.outputs:
                    for slot, value in zip(step.outputs, result, strict=True):
                        values[slot] = value
                for slot in step.frees:
                    values[slot] = None
        except (AttributeError, TypeError, RuntimeError) as exc:
            error = None if step is None else diagnose(step.call, step.args, step.stream, exc)
            if error is None:
                raise
            raise error from exc
        return load(self.output, values)

    def boxed(self, *, backward: bool = False) -> Callable[[list[Any]], Any]:
        """The AOTAutograd calling convention: one list argument, owned by the callee. A
        ``backward`` graph's program runs with its node's binding as the thread's current
        one (``bound_to_running_node``)."""

        def run(args: list[Any]) -> Any:
            inputs = list(args)
            args.clear()
            result = self.run(inputs)
            observer = watcher()
            if observer is not None:  # a race detector: what it returns is the caller's
                observer.escape(result)
            return result

        boxed = bound_to_running_node(run) if backward else run
        boxed._boxed_call = True  # type: ignore[attr-defined]
        return boxed


def bound_to_running_node(run: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """``run`` (a backward graph's) with the binding of the autograd node that runs it as
    the thread's current binding: its lookups take the forward's fast path, and a node the
    user applies directly, even from a hook of another node, uses its own call's objects.
    Without a binding there (a node the package did not bind) the lookups ask the engine."""
    thread = state

    def run_backward(args: list[Any]) -> Any:
        binding = running_node_binding()
        if binding is None:
            return run(args)
        calls = thread.calls
        outer = calls.current
        calls.current = binding
        try:
            return run(args)
        finally:
            calls.current = outer

    return run_backward


def _with_frees(steps: list[Step], kept: set[int]) -> list[Step]:
    """Each step with the slots whose last reader (or unread writer) it is."""
    last: dict[int, int] = {}
    for i, step in enumerate(steps):
        written = [step.output] if step.output is not None else list(step.outputs)
        for slot in (*refs(step.args), *refs(step.kwargs or {}), *written):
            last[slot] = i
    dies: dict[int, list[int]] = {}
    for slot, i in last.items():
        if slot not in kept:
            dies.setdefault(i, []).append(slot)
    return [replace(step, frees=tuple(dies.get(i, ()))) for i, step in enumerate(steps)]
