"""``check()``: a function's stream hazards in one call, with the fix for each.

On CPU a missing sync never changes a value, so a racy function compiles, runs and matches
eager; on a GPU it reads memory another stream is still writing. ``check`` compiles a fresh
copy of the function through a package backend, runs it once (and its backward, when an
output requires grad), and judges every forward and backward graph the backend runs with
the static checker (``testing.check_stream_safety``). Asked for ``races=True`` it runs the
compiled function once more under the run-time race detector (``testing.races``), which
sees every kernel and sync as issued.

``gpu_semantics=True`` judges the function as a GPU would run it, on any machine: it runs on
the fake accelerator (``testing.fake_accelerator``), CPU tensors count as the accelerator's,
and each simulated stream or event passed in is replaced by a fake accelerator one. Objects
the function makes itself with ``device="cpu"`` stay CPU objects, whose work is ordered on
the host: pass them in to have them judged.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import UserStreamsError


@dataclass
class CheckReport:
    """What ``check`` found; truthy when nothing. ``graphs`` pairs each graph's label
    ("forward 0", "backward 0") with its static findings; ``races`` is the race detector's
    report (None when not asked for)."""

    graphs: list[tuple[str, Any]] = field(default_factory=list)
    races: Any = None
    result: Any = None

    @property
    def hazards(self) -> list[str]:
        """Every finding as one line of text, its fix included, each labelled by graph."""
        found = [
            f"{label}: {finding}" for label, result in self.graphs for finding in result.findings
        ]
        if self.races is not None:
            found += [f"run: {finding}" for finding in self.races.findings]
        return found

    def __bool__(self) -> bool:
        return not self.hazards

    def __str__(self) -> str:
        checked = f"{len(self.graphs)} graph(s) checked"
        if self.races is not None:
            checked += f", one run watched ({self.races.kernels} kernel(s))"
        if self:
            return f"no stream hazards ({checked})"
        return "\n".join([f"{len(self.hazards)} stream hazard(s) ({checked}):", *self.hazards])


BACKENDS = ("userstreams_aot_eager", "userstreams")


def check(
    fn: Callable[..., Any],
    *args: Any,
    backend: str = "userstreams_aot_eager",
    races: bool = False,
    gpu_semantics: bool = False,
    **kwargs: Any,
) -> CheckReport:
    """Compile and run ``fn(*args, **kwargs)`` with ``backend``; report every stream hazard
    of the graphs it ran (and, with ``races``, of one more run as issued). See the module
    docstring for ``gpu_semantics``, which ``races`` implies where no accelerator is present
    (on the CPU alone every op runs in program order, which a race detector cannot judge).
    The function's side effects happen (twice with ``races``: buffers such as BatchNorm's
    statistics update), but every ``.grad`` its backward reaches is left as it was. Other
    compiled functions and Dynamo's caches are left alone: a fresh copy of ``fn`` is
    compiled."""
    if backend not in BACKENDS:
        raise UserStreamsError(
            f"torch_userstreams.check: backend={backend!r} is not one of the package's "
            f"backends {BACKENDS}; check() judges the graphs those run."
        )
    import torch

    if races and not torch.accelerator.is_available():
        gpu_semantics = True  # on CPU alone the host orders every op: nothing could race
    from .backends.check_on_compile import suspended
    from .explain import fresh_copy
    from .testing.capture import capture
    from .testing.checker import check_stream_safety

    with _semantics(gpu_semantics) as convert, suspended():
        args, kwargs = convert(args), convert(kwargs)
        captured = capture(
            fresh_copy(fn), *args, backend=backend, reset=False, backward=_backward, **kwargs
        )
        report = CheckReport(result=captured.result)
        report.graphs = [(label, check_stream_safety(gm)) for label, gm in captured.graphs]
        if races and captured.compiled is not None:
            names = _stream_names(fn, args, kwargs)
            report.races = _watched_run(captured.compiled, args, kwargs, names)
    return report


def _stream_names(fn: Callable[..., Any], args: Any, kwargs: Any) -> dict[str, Any]:
    """The streams passed in, by the names of ``fn``'s parameters: the findings use them."""
    import inspect

    import torch

    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {}
    return {name: v for name, v in bound.arguments.items() if isinstance(v, torch.Stream)}


def _watched_run(
    compiled: Callable[..., Any], args: Any, kwargs: Any, names: dict[str, Any]
) -> Any:
    from .patch.install import installed
    from .testing.races import detect_races

    with installed(), detect_races(names) as found:
        _backward(compiled(*args, **kwargs))
    return found


def _backward(out: Any) -> None:
    """The backward of ``out`` (``capture.run_backward``), leaving every ``.grad`` it reaches
    as it was: a check must not train the user's parameters."""
    import torch
    import torch.utils._pytree as pytree

    from .testing.capture import run_backward

    todo = [t.grad_fn for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    seen: set[Any] = set()
    leaves: list[torch.Tensor] = []
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)  # an AccumulateGrad node's leaf
        if isinstance(variable, torch.Tensor):
            leaves.append(variable)
        todo.extend(parent for parent, _ in node.next_functions)
    # The engine accumulates into an existing ``.grad`` in place: keep its values too.
    grads = [(leaf.grad, None if leaf.grad is None else leaf.grad.clone()) for leaf in leaves]
    try:
        run_backward(out)
    finally:
        with torch.no_grad():
            for leaf, (grad, values) in zip(leaves, grads, strict=True):
                if grad is not None and values is not None:
                    grad.copy_(values)
                leaf.grad = grad


@contextlib.contextmanager
def _semantics(gpu: bool) -> Iterator[Callable[[Any], Any]]:
    """The fake accelerator with GPU semantics when ``gpu``, and how arguments move onto it
    (each simulated stream or event passed in becomes a fake accelerator one)."""
    if not gpu:
        yield lambda value: value
        return
    import torch.utils._pytree as pytree

    from .simulator import SimEvent, SimStream
    from .testing.fake_accelerator import (
        FakeAcceleratorEvent,
        FakeAcceleratorStream,
        fake_accelerator,
    )

    moved: dict[int, Any] = {}  # one fake object per object passed in, however often

    def onto_the_accelerator(value: Any) -> Any:
        if isinstance(value, (FakeAcceleratorStream, FakeAcceleratorEvent)):
            return value
        if isinstance(value, SimStream):
            return moved.setdefault(id(value), FakeAcceleratorStream())
        if isinstance(value, SimEvent):
            return moved.setdefault(id(value), FakeAcceleratorEvent())
        return value

    with fake_accelerator(gpu_semantics=True):
        yield lambda tree: pytree.tree_map(onto_the_accelerator, tree)
