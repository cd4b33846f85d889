"""``torch.compile`` backends that use the package: registered by name via entry points.

* ``userstreams``: Inductor, with the package's table, prologue and passes; a graph that
  uses streams is compiled region by region and each region runs on its own stream
  (``stream_regions_compile``); on CPU it is one Inductor graph without its syncs.
* ``userstreams_aot_eager``: AOTAutograd with the package's passes, executing each node on
  its annotated stream (``stream_executor``) — for debugging stream programs.

Using either installs the package: Dynamo imports this module when it resolves the backend
name, before it traces anything, so importing it installs (``install()`` is idempotent).
``import torch_userstreams`` alone still patches nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .errors import UnsupportedPathError
from .patching import install
from .registration import is_compiling_with_package, table_if_compiling


def _require_package(backend: str) -> None:
    """The frame must have been traced with the package installed, or its objects are native."""
    if not is_compiling_with_package():
        install()
        raise UnsupportedPathError(
            f"torch_userstreams: backend {backend!r} got a graph that Dynamo traced while "
            "torch_userstreams was not installed (uninstall() was called after the backend "
            "was resolved). It is installed now: call torch._dynamo.reset() and run again, "
            "or call torch_userstreams.install() before compiling."
        )


def userstreams(
    gm: torch.fx.GraphModule,
    example_inputs: list[Any],
    on_graph: Callable[[torch.fx.GraphModule, dict[str, Any]], None] | None = None,
) -> Any:
    """Inductor with torch_userstreams installed, each stream region compiled by Inductor
    and run on its stream (``stream_regions_compile``). ``on_graph`` (for ``testing.capture``)
    sees each forward and backward graph before it is compiled."""
    _require_package("userstreams")
    from torch._inductor.compile_fx import compile_fx

    from .regions import has_stream_work
    from .stream_regions_compile import compile_fx_with_regions

    if not has_stream_work(gm):
        return compile_fx(gm, example_inputs)
    return compile_fx_with_regions(gm, example_inputs, table_if_compiling(), on_graph=on_graph)


def userstreams_aot_eager(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """AOTAutograd with our passes, each node run on its own stream."""
    _require_package("userstreams_aot_eager")
    from torch._dynamo.backends.common import aot_autograd

    from .stream_executor import compile_with_streams

    backend = aot_autograd(fw_compiler=compile_with_streams, bw_compiler=compile_with_streams)
    return backend(gm, example_inputs)


install()
