"""One call's binding: the graph it runs, then that call's objects, in table order.

A binding is a plain tuple ``(graph, object 0, object 1, ...)``: the prologue builds it
with one ``BUILD_TUPLE`` and no Python frame (a tuple subclass would cost a copy per call),
and ``lookup(i)`` reads item ``i + 1``. An entry is None when the prologue did not load it.
The binding holds the call's objects strongly: whoever keeps it (the call, then its autograd
nodes until the backward ran) keeps them alive, as eager's autograd graph keeps the streams
its ops ran on. The graph is anything with a ``table`` (a ``BoundGraph``).
"""

from __future__ import annotations

from typing import Any

from ..errors import UserObjectError

Binding = tuple[Any, ...]


def graph_of(binding: Binding) -> Any:
    return binding[0]


def objects_of(binding: Binding) -> tuple[Any, ...]:
    return binding[1:]


def resolve(binding: Binding, index: int) -> Any:
    """The object at table ``index`` of the call ``binding``; checked, with a clear error."""
    if type(index) is not int or not 0 <= index < len(binding) - 1:
        raise _no_such_index(binding, index)
    obj = binding[index + 1]
    if obj is None:
        raise _unloaded(binding, index)
    return obj


def _no_such_index(binding: Binding, index: object) -> UserObjectError:
    """Why ``index`` names no entry: the wrong type, below 0, or past this graph's table
    (most likely an index that another graph's compile returned)."""
    size = len(binding) - 1
    if type(index) is not int:
        why = f"an index is an int, not {type(index).__name__}"
    elif index < 0:
        why = "indices start at 0"
    else:
        why = "it is past the end of the table (an index from another graph's compile?)"
    return UserObjectError(
        f"torch_userstreams: graph {graph_of(binding).table.graph_name} has no user object at "
        f"index {index!r} (its table has {size} entries): {why}. Use the index that "
        "new_stream(), new_event() or current_stream() returned in the compile being run."
    )


def _unloaded(binding: Binding, index: int) -> UserObjectError:
    table = graph_of(binding).table
    entry = table.entries[index]
    return UserObjectError(
        f"torch_userstreams: user object {index} of graph {table.graph_name} "
        f"({entry.kind.value} {entry.example_type}, {entry.origin}) was not loaded by the "
        "prologue because no node of the graph read it at compile time. A backend that "
        "reads it must request it with torch_userstreams.current_stream() while compiling."
    )
