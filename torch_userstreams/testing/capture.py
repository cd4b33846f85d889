"""``capture``: the FX graphs a package backend really executes for a function.

Runs ``fn`` compiled through the package (installing it for the call), then its backward
when an output requires grad, and keeps every forward and backward graph exactly as the
backend's compilers receive them:

* ``userstreams_aot_eager``: the modules AOTAutograd hands to the forward/backward
  compilers, which then run them with ``backends.executor.compile_with_streams`` (the
  package's backend, with recording compilers);
* ``userstreams``: the modules Inductor's ``compile_fx`` hands to its inner compiler (the
  package's ``InductorGraphCompiler``), before it strips or splits them. Graphs without
  streams go to Inductor directly and are not recorded.

Each graph's ``gm.meta[CURRENT_STREAMS_META]`` is set to the table indices of its current
streams, so ``check_stream_safety(gm)`` knows that unannotated nodes run on them, and
``gm.meta[STREAM_DEVICES_META]`` to each entry's device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from ..compile import graph_compile
from ..compile.table import UserObjectTable
from ..errors import UnsupportedPathError
from ..patch.install import installed
from .checker import CURRENT_STREAMS_META, STREAM_DEVICES_META

SUPPORTED_BACKENDS = ("userstreams_aot_eager", "userstreams")


@dataclass
class Capture:
    """What one compiled run of a function executed.

    ``backward`` is in backward-compile order: a backward compiles when it first runs, so
    after a graph break the last graph's backward comes first.
    """

    forward: list[torch.fx.GraphModule] = field(default_factory=list)
    backward: list[torch.fx.GraphModule] = field(default_factory=list)
    tables: list[UserObjectTable] = field(default_factory=list)
    result: Any = None
    compiled: Callable[..., Any] | None = None  # call it again: no recompile, no recording

    @property
    def graphs(self) -> list[tuple[str, torch.fx.GraphModule]]:
        """Every graph with a label ("forward 0", "backward 1", ...), forwards first."""
        return [(f"forward {i}", gm) for i, gm in enumerate(self.forward)] + [
            (f"backward {i}", gm) for i, gm in enumerate(self.backward)
        ]


def mark_streams(gm: torch.fx.GraphModule, table: UserObjectTable) -> None:
    """What the checker needs of the table: the current streams, each entry's device."""
    gm.meta[CURRENT_STREAMS_META] = table.current_streams()
    devices = {entry.index: entry.device for entry in table.entries}
    gm.meta[STREAM_DEVICES_META] = {i: str(d) for i, d in devices.items() if d is not None}


def _recording(
    into: list[torch.fx.GraphModule], table: UserObjectTable | None, compiler: Callable[..., Any]
) -> Callable[..., Any]:
    """A compiler that keeps the module it is handed, marks its current streams, delegates."""

    def compile_and_record(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        if table is not None:
            mark_streams(gm, table)
        into.append(gm)
        return compiler(gm, example_inputs, **kwargs)

    return compile_and_record


def _aot_eager_backend(result: Capture) -> Callable[..., Any]:
    from ..backends import aot_with_executor
    from ..backends.executor import compile_backward_with_streams, compile_with_streams

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        table = _table_of_graph("userstreams_aot_eager")
        inner = aot_with_executor(  # the backend's own: the graphs it runs
            _recording(result.forward, table, compile_with_streams),
            _recording(result.backward, table, compile_backward_with_streams),
        )
        return inner(gm, example_inputs)

    return backend


def _inductor_backend(result: Capture) -> Callable[..., Any]:
    from ..backends import userstreams_backend

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        table = _table_of_graph("userstreams")

        def on_graph(graph: torch.fx.GraphModule, kwargs: dict[str, Any]) -> None:
            into = result.backward if kwargs.get("is_backward", False) else result.forward
            mark_streams(graph, table)
            into.append(graph)

        return userstreams_backend(gm, example_inputs, on_graph=on_graph)

    return backend


def _table_of_graph(backend: str) -> UserObjectTable:
    compile_ = graph_compile.active_or_none()
    if compile_ is None:
        raise UnsupportedPathError(
            f"torch_userstreams.testing.capture: backend {backend!r} got a graph traced "
            "without the package installed; call torch._dynamo.reset() and capture again."
        )
    return compile_.table


@contextlib.contextmanager
def no_compile_caches() -> Iterator[None]:
    """Inductor's FX graph cache and AOTAutograd's cache off: a hit would skip the compilers
    (and so what capture records, or what a compile-time benchmark times)."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with (
        functorch_config.patch(enable_autograd_cache=False),
        inductor_config.patch(fx_graph_cache=False),
    ):
        yield


def run_backward(out: Any) -> None:
    """Backward of the sum of every output that requires grad (nothing if none does)."""
    tensors = [
        t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and t.requires_grad
    ]
    if tensors:
        total = sum(t.sum() for t in tensors)
        total.backward()  # type: ignore[union-attr]


def capture(
    fn: Callable[..., Any],
    *args: Any,
    backend: str = "userstreams_aot_eager",
    reset: bool = True,
    backward: Callable[[Any], None] | None = None,
    **kwargs: Any,
) -> Capture:
    """Compile and run ``fn(*args, **kwargs)`` once through the package; keep its graphs.

    With ``reset`` it calls ``torch._dynamo.reset()`` first, for the whole process, so that
    ``fn`` compiles even if it was compiled before; ``check()`` passes a fresh copy instead
    (``explain.fresh_copy``) and leaves the rest of the process alone. ``backward`` runs the
    backward of the result (default ``run_backward``).
    """
    makers = {"userstreams_aot_eager": _aot_eager_backend, "userstreams": _inductor_backend}
    if backend not in makers:
        raise ValueError(
            f"torch_userstreams.testing.capture supports the backends {SUPPORTED_BACKENDS}, "
            f"not {backend!r}: it records the graphs those hand to their compilers."
        )
    if reset:  # not after: ``compiled`` stays callable without a recompile
        torch._dynamo.reset()
    result = Capture()
    result.compiled = torch.compile(fn, backend=makers[backend](result))
    with installed(), no_compile_caches(), graph_compile.collecting_tables() as tables:
        result.result = result.compiled(*args, **kwargs)
        (backward or run_backward)(result.result)
    result.tables = list(tables)
    return result
