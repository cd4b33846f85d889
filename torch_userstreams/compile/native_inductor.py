"""Refuse, at compile time, a CPU graph with streams that native Inductor would break.

Inductor 2.12+ issues user streams in its wrapper (2.11 ignores them). It defines its stream
variables (``stream1 = ...``) inside a device guard, and CPU code has none: a graph of CPU
tensors with work annotated to a user stream compiles to ``with stream1:`` and fails when
called, ``NameError: name 'stream1' is not defined`` (natively too). ``backend="userstreams"``
compiles the same graph as one Inductor graph without its stream annotations, which is
exact on CPU.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.fx

from ..errors import UnsupportedPathError
from ..fx.meta import stream_of


def _is_native_inductor(compiler_fn: Any) -> bool:
    from torch._inductor.compile_fx import compile_fx

    while compiler_fn is not None:
        if isinstance(compiler_fn, torch._TorchCompileInductorWrapper) or compiler_fn is compile_fx:
            return True
        compiler_fn = getattr(compiler_fn, "_torchdynamo_orig_backend", None)
    return False


def inductor_enters_streams() -> bool:
    """Whether this torch's Inductor enters user streams in its generated code (2.12+)."""
    return importlib.util.find_spec("torch._inductor.stream_constants") is not None


def _tensors(node: torch.fx.Node) -> list[torch.Tensor]:
    value = node.meta.get("example_value")
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, torch.Tensor)]


def refuse_cpu_streams(graph: torch.fx.Graph, compiler_fn: Any, graph_name: str) -> None:
    """Raise when native Inductor gets ``graph``, all of it on CPU, with stream work."""
    if not _is_native_inductor(compiler_fn) or not inductor_enters_streams():
        return
    annotated = [node for node in graph.nodes if stream_of(node) is not None]
    if not annotated:
        return
    # Name an op if one is annotated (a placeholder first read inside ``with stream:`` is too).
    on_stream = next((n for n in annotated if n.op == "call_function"), annotated[0])
    if any(t.device.type != "cpu" for node in graph.nodes for t in _tensors(node)):
        return
    raise UnsupportedPathError(
        f"torch_userstreams: backend 'inductor' cannot run graph {graph_name}: node "
        f"{on_stream.name} runs on user stream {stream_of(on_stream)} with CPU tensors, and "
        "Inductor's CPU code enters such a stream without defining it (it fails when "
        "called with \"NameError: name 'stream1' is not defined\", natively too). Use "
        "torch.compile(fn, backend='userstreams'): on CPU it compiles the graph with "
        "Inductor, without its stream annotations, which changes no value."
    )
