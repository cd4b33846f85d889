"""A compiled graph as a list of steps the host issues in order, each on its stream.

Both package backends run graphs this way: ``userstreams_aot_eager`` one step per node,
``userstreams`` one step per Inductor-compiled stream region, and both one step per sync.
A ``Program`` is built once per compile and written out as one Python function
(``launcher``); each call runs that function with values of its own, in its locals (nothing
per call lives on the program, so calls on several threads do not meet), and drops every
value after its last use, as eager code would.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch.autograd.profiler as profiler

from ..observe import watcher
from .backward import backward_binding
from .issue_syncs import diagnose
from .launcher import failed_step, generate
from .state import state
from .steps import Ref, Step

__all__ = ["Program", "Ref", "Step", "bound_to_running_node", "refs"]


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
    """Steps over ``size`` value slots; ``inputs`` are the slots of the graph's inputs.

    Built once per compile, it is written out as one Python function (``launcher``), which
    each call runs."""

    def __init__(self, size: int, inputs: list[int], steps: list[Step], output: Any) -> None:
        self.size = size
        self.inputs = inputs
        self.output = output
        self.steps = _with_frees(steps, set(refs(output)))
        self.launcher = generate(inputs, self.steps, output)
        # The first call runs every step's full entry (Inductor ends its autotune-cache
        # bundling there); later ones the direct entries, unless watched (``boxed``).
        self.warm = False
        _trace(self.launcher.source)

    def run(self, inputs: list[Any], *, watched: bool = True) -> Any:
        """Run the launcher on ``inputs``; unless ``watched``, through the steps' direct
        entries (``launcher``)."""
        launch = self.launcher.launch_watched if watched else self.launcher.launch
        try:
            return launch(*inputs)
        except (AttributeError, TypeError, RuntimeError) as exc:
            error = _diagnosis(self, exc)
            if error is None:
                raise
            raise error from exc

    def boxed(self, *, backward: bool = False) -> Callable[[list[Any]], Any]:
        """The AOTAutograd calling convention: one list argument, owned by the callee. A
        ``backward`` graph's program runs with its node's binding as the thread's current
        one (``bound_to_running_node``). A call nobody watches (no race detector, no
        profiler, no execution-order recording) after the first takes the steps' direct
        entries."""

        def run(args: list[Any]) -> Any:
            inputs = list(args)
            args.clear()
            observer = watcher()
            if observer is None and self.warm and not _inductor_watches():
                return self.run(inputs, watched=False)
            result = self.run(inputs)
            self.warm = True
            if observer is not None:  # a race detector: what it returns is the caller's
                observer.escape(result)
            return result

        boxed = bound_to_running_node(run) if backward else run
        boxed._boxed_call = True  # type: ignore[attr-defined]
        return boxed


def _inductor_watches() -> bool:
    """Whether torch records each compiled graph's call: the profiler's labels, and the
    execution order ``torch._inductor.debug`` writes to the structured trace. Both are
    ``CompiledFxGraph.__call__``'s, which the direct entries skip."""
    if profiler._is_profiler_enabled:
        return True
    debug = sys.modules.get("torch._inductor.debug")
    return bool(getattr(debug, "RECORD_GRAPH_EXECUTION", False))


def _trace(source: str) -> None:
    """How the graph is launched (the generated function) as an artifact of ``TORCH_TRACE``'s
    structured log, beside its table, so tlparse shows it (free without a trace)."""
    from torch._logging import trace_structured

    trace_structured(
        "artifact",
        metadata_fn=lambda: {"name": "torch_userstreams_launcher", "encoding": "string"},
        payload_fn=lambda: source,
    )


def _diagnosis(program: Program, exc: Exception) -> Exception | None:
    """What the package can say about the step that raised ``exc`` (``issue_syncs.diagnose``),
    or None. Only asked after a step raised: the per-call path pays nothing for it."""
    index = failed_step(program.launcher, exc)
    if index is None:
        return None
    step = program.steps[index]
    return diagnose(step.call, step.args, step.stream, exc)


def bound_to_running_node(run: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
    """``run`` (a backward graph's) with the binding of the autograd node that runs it as
    the thread's current binding: its lookups take the forward's fast path, and a node the
    user applies directly, even from a hook of another node, uses its own call's objects.
    Without a binding there (a node the package did not bind) the lookups ask the engine."""
    thread = state

    def run_backward(args: list[Any]) -> Any:
        binding = backward_binding(inside_apply=True)
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
