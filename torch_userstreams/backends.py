"""``torch.compile`` backends that use the package: registered by name via entry points.

* ``userstreams``: Inductor, with the package's table, prologue and backward passes. Inductor
  cannot generate stream code for CPU graphs (torch 2.11-2.15: the wrapper uses stream
  variables it only defines for GPU devices, and side-effecting sync ops get reordered), so a
  CPU graph that uses streams runs through ``userstreams_aot_eager`` instead (CPU runs in
  program order: same values); stream-free CPU graphs still go to Inductor.
* ``userstreams_aot_eager``: AOTAutograd with the package's passes, executing each node on
  its annotated stream (``stream_executor``) — for debugging stream programs.

Using either installs the package: Dynamo imports this module when it resolves the backend
name, before it traces anything, so importing it installs (``install()`` is idempotent).
``import torch_userstreams`` alone still patches nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .errors import UnsupportedPathError
from .patching import install
from .registration import is_compiling_with_package

log = logging.getLogger("torch_userstreams")


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


def _uses_streams(gm: torch.fx.GraphModule) -> bool:
    from .passes.annotations import stream_of
    from .passes.backward_syncs import is_sync

    return any(stream_of(n) is not None or is_sync(n) for n in gm.graph.nodes)


def _on_cpu_only(example_inputs: list[Any]) -> bool:
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    return devices <= {"cpu"}


def userstreams(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """Inductor with torch_userstreams installed (see the module docstring for CPU graphs)."""
    _require_package("userstreams")
    if _on_cpu_only(example_inputs) and _uses_streams(gm):
        log.info("torch_userstreams: CPU graph with streams runs on the stream executor")
        return userstreams_aot_eager(gm, example_inputs)
    from torch._inductor.compile_fx import compile_fx

    return compile_fx(gm, example_inputs, **kwargs)


def userstreams_aot_eager(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    """AOTAutograd with our passes, each node run on its own stream."""
    _require_package("userstreams_aot_eager")
    from torch._dynamo.backends.common import aot_autograd

    from .stream_executor import compile_with_streams

    backend = aot_autograd(fw_compiler=compile_with_streams, bw_compiler=compile_with_streams)
    return backend(gm, example_inputs)


install()
