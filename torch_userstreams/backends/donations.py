"""Keep AOTAutograd's donated buffers true to the graphs the ``userstreams`` backend runs.

AOTAutograd lets the compiled backward reuse the memory of saved tensors it calls
*donated*: saved tensors that share storage with no graph input, no user output and no
other saved tensor. It decides that on the partitioned graphs, where a sync's
``control_deps`` passthrough is a tensor of its own. The backend runs those passthroughs
as their operands (the CPU path removes the syncs; the regions path issues them between
regions), so a passthrough of an input, or two passthroughs of one value, become the same
tensor at run time. A backward that reused such a "donated" buffer in place overwrote the
caller's leaf tensors or a second saved tensor (wrong gradients, silently).

Inductor reads the donated indices from the tracing context when it compiles a backward
graph, counting its own placeholders. A region of a backward graph has placeholders of its
own, so the graph's indices do not apply to it at all.

* ``drop_aliased_donations`` (forward graphs): keeps only the saved tensors still unique
  after the passthroughs resolve. A view of a passthrough shares its operand's memory too,
  and so does the new value of an input that the graph writes back (Inductor computes a
  sliced update in the input's own memory): a saved view of an updated input, reused by
  the backward, overwrote the caller's tensor;
* ``no_donations`` (backward graphs split into regions): donates nothing;
* ``keyed_by_donations`` (backward graphs): Inductor's FX graph cache key leaves the donated
  indices out (natively they follow from the graphs), so a backward compiled with other
  donations, by native torch or by an earlier version of this package, would be served
  as is. The indices go into the key's tag.

The lists are changed in place: the tracing context, AOTAutograd's metadata and the lazy
backward's saved context share one list.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
from torch.multiprocessing.reductions import StorageWeakRef

from ..fx.control_deps import alias_of
from ..passes.write_backs import copies_into_input


def _donated_list() -> tuple[Any, list[int]] | None:
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = None if context is None else context.fw_metadata
    donated = None if meta is None else getattr(meta, "bw_donated_idxs", None)
    if not donated:
        return None
    return meta, donated


def _storage(node: Any) -> StorageWeakRef | None:
    value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    if not isinstance(value, torch.Tensor) or value.is_sparse:
        return None
    return StorageWeakRef(value.untyped_storage())


class _RunTimeStorages:
    """Which traced storages are one memory at run time, as a union-find over them: a
    passthrough's and its operand's (views of either follow, as they share the traced
    storage), and a written-back value's and its input's."""

    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self._parent: dict[StorageWeakRef, StorageWeakRef] = {}
        for node in gm.graph.nodes:
            source = alias_of(node)
            if source is not None and source is not node:
                self._join(_storage(node), _storage(source))
            elif copies_into_input(node):
                self._join(_storage(node.args[1]), _storage(node.args[0]))

    def _find(self, storage: StorageWeakRef) -> StorageWeakRef:
        while (parent := self._parent.get(storage, storage)) != storage:
            storage = parent
        return storage

    def _join(self, a: StorageWeakRef | None, b: StorageWeakRef | None) -> None:
        if a is not None and b is not None and self._find(a) != self._find(b):
            self._parent[self._find(a)] = self._find(b)

    def of(self, node: Any) -> StorageWeakRef | None:
        storage = _storage(node)
        return None if storage is None else self._find(storage)


def drop_aliased_donations(gm: torch.fx.GraphModule) -> None:
    """For the forward graph ``gm``: donate only saved tensors that, at run time, share
    memory with no input, no user output and no other saved tensor."""
    found = _donated_list()
    if found is None:
        return
    meta, donated = found
    storages = _RunTimeStorages(gm)
    output = next(reversed(gm.graph.find_nodes(op="output")))
    outputs = list(output.args[0])
    saved = outputs[meta.tensors_saved_for_backwards_slice]
    others = collections.Counter(
        storages.of(node)
        for node in (*gm.graph.find_nodes(op="placeholder"), *outputs[: meta.num_forward])
    )
    saved_storages = [storages.of(node) for node in saved]
    uses = collections.Counter(saved_storages)
    offset = meta.num_symints_saved_for_bw

    def still_unique(index: int) -> bool:
        storage = saved_storages[index - offset]
        return storage is not None and uses[storage] == 1 and storage not in others

    donated[:] = [index for index in donated if still_unique(index)]


def no_donations() -> None:
    """For a backward graph compiled as regions: no region may reuse an input's memory."""
    found = _donated_list()
    if found is not None:
        found[1].clear()


@contextlib.contextmanager
def keyed_by_donations() -> Iterator[None]:
    """Compile a backward graph under a cache key that names its donated indices."""
    found = _donated_list()
    donated = [] if found is None else list(found[1])
    tag = f"{torch.compiler.config.cache_key_tag}|torch_userstreams.donated={donated}"
    with torch.compiler.config.patch(cache_key_tag=tag):  # type: ignore[attr-defined]
        yield


@contextlib.contextmanager
def true_donations(
    gm: torch.fx.GraphModule, kwargs: dict[str, Any], regions: bool
) -> Iterator[None]:
    """Around the compile of a graph with stream work (``kwargs``: ``inner_compile``'s)."""
    if not kwargs.get("is_backward"):
        if not kwargs.get("is_inference"):
            drop_aliased_donations(gm)
        yield
        return
    if regions:
        no_donations()
    with keyed_by_donations():
        yield
