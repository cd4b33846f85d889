"""Native Dynamo's process-global user-object table, where the package must still meet it.

Two cases, both at the edge of ``install()``:

* a graph compiled *before* ``install()`` still has a native prologue that fills native's
  table, while its ``streams::*`` ops reach the package's ``lookup`` (install patched the
  name they call): ``object_at`` reads that table for them, and only that table;
* after ``uninstall()``, the ``streams::*`` ops call native's lookup again, which reads
  native's table: a graph compiled while installed fills it with its call's objects
  (``feed``) before its forward, and before its backward (``backward.attach``).

``fill_native_table`` is the one flag the per-call path reads: False while installed, True
from the moment ``uninstall()`` begins (calls still running finish on the package's lookup,
later ones need native's table). Whether the package is installed is ``patch.install``'s.
"""

from __future__ import annotations

from typing import Any


class _Unloaded:
    """Stands in native's table for an entry the prologue did not load (it takes only
    weak-referenceable objects, by position)."""


_UNLOADED = _Unloaded()
fill_native_table = True


def set_fill_native_table(value: bool) -> None:
    global fill_native_table
    fill_native_table = value


def _table() -> Any:
    from torch._dynamo import graph_bytecode_inputs

    return graph_bytecode_inputs.index_to_external_object_weakref


def object_at(index: Any) -> Any | None:
    """The live object at ``index`` of native's table, or None (absent, dead, unloaded)."""
    table = _table()
    try:
        ref = table[index]
    except (KeyError, IndexError, TypeError):
        return None
    obj = ref()
    return None if obj is None or obj is _UNLOADED else obj


def feed(binding: tuple[Any, ...]) -> None:
    """Fill native's table with the objects of ``binding`` (graph, object 0, object 1, ...)."""
    from torch._dynamo import graph_bytecode_inputs

    objects = (_UNLOADED if obj is None else obj for obj in binding[1:])
    graph_bytecode_inputs.store_user_object_weakrefs(*objects)
