"""The package's Inductor compiles are cached apart from native Inductor's.

Inductor's FX graph cache keys a graph by its code, not by its nodes' stream annotations,
so a graph native Inductor compiled inside a ``with stream:`` block and the same ops
without it share one entry: whichever compiled first serves the other, stream code and
all: a stream-free graph of the package would fail with ``NameError: name 'stream1' is not
defined`` (and on an accelerator could run on a stream it never named). Every compile of
the package's ``userstreams`` backend adds a tag to the cache keys, forward and (lazily
compiled) backward alike, so only the package's own stream-free code can serve it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

TAG = "torch_userstreams"


@contextlib.contextmanager
def own_cache_entries() -> Iterator[None]:
    """Inductor's and AOTAutograd's cache keys name the package while this is entered."""
    tag = torch.compiler.config.cache_key_tag  # type: ignore[attr-defined]
    if TAG in tag.split("|"):
        yield
        return
    with torch.compiler.config.patch(cache_key_tag=f"{tag}|{TAG}"):  # type: ignore[attr-defined]
        yield


@contextlib.contextmanager
def keyed_by_streams(gm: torch.fx.GraphModule) -> Iterator[None]:
    """Compile a graph Inductor runs on several streams under a key that names each node's
    stream: its code alone is the same as that of the same ops on other streams (or on
    none), whose compiled code would run them where this graph does not. The key names the
    package's own code too: while installed, the package writes part of the code Inductor
    generates for such a graph (``inductor.launch_code``), and a cache warmed by another
    version of it would serve that version's code."""
    from ..fx.meta import stream_of

    placed = [(node.name, stream_of(node)) for node in gm.graph.nodes]
    digest = hashlib.sha256(repr(placed).encode()).hexdigest()[:16]
    tag = torch.compiler.config.cache_key_tag  # type: ignore[attr-defined]
    keys = f"{tag}|streams={digest}|code={package_code_digest()}"
    with torch.compiler.config.patch(cache_key_tag=keys):  # type: ignore[attr-defined]
        yield


@functools.cache
def package_code_digest() -> str:
    """A digest of every module of the installed package (read once per process)."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    found = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        found.update(str(path.relative_to(root)).encode())
        found.update(path.read_bytes())
    return found.hexdigest()[:16]


# Inductor's name for the higher-order op that pins each sync of a graph compiled as one call.
CONTROL_DEPS = "torch.ops.higher_order.control_deps"


def control_deps_cached() -> dict[str, Any]:
    """Inductor config under which its FX graph cache keeps a graph holding ``control_deps``
    (torch 2.12-2.15 bypass every such graph). The op's subgraphs are the graph's attributes,
    whose code is in the key, and a sync in them names only table indices, which the same
    trace numbers the same; the entry is keyed by the package's code as well."""
    import torch._inductor.config as inductor_config

    marked = dict(getattr(inductor_config, "unsafe_marked_cacheable_functions", {}))
    marked[CONTROL_DEPS] = f"{TAG} {package_code_digest()}"
    return {"unsafe_marked_cacheable_functions": marked}


def tagged(compiler: Callable[..., Any]) -> Callable[..., Any]:
    """``compiler`` run under ``own_cache_entries``: an inner compiler that AOTAutograd
    calls for the backward at its first run, after the forward's compile returned."""

    @functools.wraps(compiler)
    def compile_in_own_entries(*args: Any, **kwargs: Any) -> Any:
        with own_cache_entries():
            return compiler(*args, **kwargs)

    return compile_in_own_entries
