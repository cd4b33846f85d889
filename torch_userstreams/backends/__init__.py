"""``torch.compile`` backends that use the package, registered by name via entry points.

* ``userstreams``: Inductor, with the package's table, prologue and passes; a graph that
  uses streams is compiled as one call that runs each node on its stream (on CPU without
  its syncs, which program order meets), or, asked with
  ``options={"userstreams.one_call": False}``, region by region, each region run on its own
  stream (``inductor_graphs``; on CPU one Inductor graph without its streams and syncs).
* ``userstreams_aot_eager``: AOTAutograd with the package's passes, executing each node on
  its annotated stream (``executor``) — for debugging stream programs.

Naming either installs the package: Dynamo resolves a backend name when ``torch.compile``
is called, before it traces anything, by reading the attribute the entry point names, and
reading ``userstreams`` / ``userstreams_aot_eager`` here installs (``install()`` is
idempotent). Importing this module patches nothing; the backends themselves are
``userstreams_backend`` and ``userstreams_aot_eager_backend``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..compile import graph_compile
from ..errors import UnsupportedPathError

GraphHook = Callable[[torch.fx.GraphModule, dict[str, Any]], None]


def _compile_of(backend: str, gm: torch.fx.GraphModule) -> graph_compile.GraphCompile | None:
    """The graph's compile, or None for a graph that no package compile holds: one Dynamo
    traced with the package uninstalled (a recompile after ``uninstall()`` of a function
    compiled before it), or one handed to the backend outside ``torch.compile``.

    Without streams or syncs such a graph needs nothing of the package, and the backend
    compiles it as its native counterpart does; with them it is refused, naming the graph
    and the fix. Nothing is installed behind the user's back: that would change what every
    later eager call and compile sees. A graph with a compile is checked for what neither
    backend can run (``subgraph_streams``), and for saved-tensors hooks around its streams
    (``saved_hooks``), before anything compiles.
    """
    compile_ = graph_compile.active_or_none()
    if compile_ is None:
        from ..inductor.regions import has_stream_work

        if has_stream_work(gm):
            raise UnsupportedPathError(_refusal(backend, gm))
        return None
    from ..inductor.regions import has_stream_work
    from .saved_hooks import refuse_saved_tensors_hooks
    from .subgraph_streams import refuse_streams_in_subgraphs

    refuse_streams_in_subgraphs(gm, compile_.table)
    if has_stream_work(gm):
        refuse_saved_tensors_hooks(compile_.table)
    return compile_


def _refusal(backend: str, gm: torch.fx.GraphModule) -> str:
    from ..patch.install import is_installed

    graph = f"backend {backend!r} got a graph that uses streams or events ({_label(gm)})"
    if not is_installed():
        return (
            f"torch_userstreams: {graph}, traced while torch_userstreams was not installed "
            "(uninstall() was called, or an installed() block ended, after the function was "
            "compiled, and this call recompiled it; or it was never installed). Call "
            "torch_userstreams.install() before calling it, or compile and call it inside "
            "the installed() block only."
        )
    return (
        f"torch_userstreams: {graph} that no torch.compile traced with the package "
        "installed: the backend needs the user-object table Dynamo builds while it traces. "
        f"Pass the function to torch.compile(fn, backend={backend!r}) instead of calling "
        "the backend on a graph."
    )


def _label(gm: torch.fx.GraphModule) -> str:
    """``in f, compile 0/1``: the traced function (from the graph's stack traces) and
    Dynamo's compile id, where known."""
    import re

    from torch._guards import CompileContext

    parts = []
    for node in gm.graph.nodes:
        found = re.search(r", in (\S+)", node.meta.get("stack_trace") or "")
        if found:
            parts.append(f"in {found.group(1)}")
            break
    compile_id = CompileContext.current_compile_id()
    if compile_id is not None:
        parts.append(f"compile {compile_id}")
    return ", ".join(parts) or "not traced by Dynamo"


def userstreams_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    on_graph: GraphHook | None = None,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """Inductor with torch_userstreams installed: each forward and backward graph with
    streams is compiled as one call, or region by region where
    ``options={"userstreams.one_call": False}`` asks (``inductor_graphs``). The other
    ``mode`` and ``options`` (``torch.compile``'s) are Inductor's, for the forward and the
    backward. ``on_graph`` (for ``testing.capture``) sees each forward and backward graph
    before it is compiled."""
    compile_ = _compile_of("userstreams", gm)
    from torch._inductor.compile_fx import compile_fx, compile_fx_inner

    from ..inductor.regions import has_stream_work
    from .cache_tag import own_cache_entries, tagged
    from .inductor_graphs import compile_fx_with_streams
    from .inductor_options import config_patches, package_options

    one_call, options = package_options(options)
    patches = config_patches(mode, options)
    with own_cache_entries():
        if compile_ is None or not has_stream_work(gm):
            inner = tagged(compile_fx_inner)
            return compile_fx(gm, example_inputs, inner_compile=inner, config_patches=patches)
        return compile_fx_with_streams(
            gm,
            example_inputs,
            compile_,
            on_graph=on_graph,
            config_patches=patches,
            one_call=one_call,
        )


def userstreams_aot_eager_backend(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    mode: str | None = None,
    options: dict[str, Any] | None = None,
) -> Any:
    """AOTAutograd with the package's passes, each node run on its own stream. Like
    ``aot_eager`` it takes ``torch.compile``'s ``mode`` and ``options`` and ignores them:
    they configure Inductor, which this backend does not use. Unknown names are refused,
    known ones named in a warning."""
    from .inductor_options import package_options, warn_ignored

    # Each node runs on its own stream here, whatever way ``userstreams`` would compile it.
    warn_ignored(mode, package_options(options)[1])
    compile_ = _compile_of("userstreams_aot_eager", gm)
    if compile_ is None:
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)
    from .check_on_compile import checked
    from .executor import compile_backward_with_streams, compile_with_streams

    backend = aot_with_executor(
        checked(compile_with_streams, compile_.table, "forward"),
        checked(compile_backward_with_streams, compile_.table, "backward"),
    )
    return backend(gm, example_inputs)


def aot_with_executor(forward: Callable[..., Any], backward: Callable[..., Any]) -> Any:
    """AOTAutograd as ``userstreams_aot_eager`` runs it, with ``forward`` and ``backward``
    compiling the graphs. Input mutations stay in the graph, as with ``aot_eager`` and
    Inductor: AOTAutograd would otherwise apply them after the graph returns, on the current
    stream, with no wait for the stream that computed them. Partitioned with min-cut, as
    ``aot_eager`` and ``userstreams`` are: it keeps impure forward nodes (syncs) in the
    forward and copies no random op into the backward, where it would draw again."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return aot_autograd(
        fw_compiler=forward,
        bw_compiler=backward,
        inference_compiler=inference_synced(forward),
        partition_fn=min_cut_rematerialization_partition,
        keep_inference_input_mutations=True,
    )


def inference_synced(compiler: Callable[..., Any]) -> Callable[..., Any]:
    """An AOTAutograd ``inference_compiler``: ``compiler``, after the inference graph's
    deallocation syncs that torch 2.11's AOTAutograd never asks for."""
    from ..passes import sync_inference_graph_in_backend

    def compile_inference(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        sync_inference_graph_in_backend(gm)
        return compiler(gm, example_inputs, **kwargs)

    return compile_inference


_BY_NAME = {
    "userstreams": userstreams_backend,
    "userstreams_aot_eager": userstreams_aot_eager_backend,
}


def __getattr__(name: str) -> Any:
    """The entry points' names: installs the package, then hands the backend over."""
    if name in _BY_NAME:
        from ..patch.install import install

        install()
        return _BY_NAME[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
