"""``lookup``: the object at a table index, for whoever asks right now.

Every read of a user object goes through here: FX lookup nodes, the ``streams::*`` ops, the
executors, Inductor's generated code. The resolvers are tried in order; the first that knows
the asker's context answers:

1. the compiled call running on this thread (its binding);
2. the forward call whose backward node runs now (the binding on that node);
3. the graph being traced or compiled on this thread (its example objects);
4. the graph strict ``torch.export`` re-runs after Dynamo's compile closed;
5. native Dynamo's table, for a graph compiled before ``install()`` whose native prologue
   filled it.

Anything else is an error that says so.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

from ..errors import UserObjectError, compiled_autograd_hint
from . import native
from .backward import backward_binding
from .binding import resolve
from .state import compile_in_progress, never_trace, state


def lookup(index: int) -> Any:
    """The current call's user object at ``index``; usable as an FX node target."""
    binding = state.calls.current
    if binding is not None:
        try:  # the common case, without calling resolve
            obj = binding[index + 1]
        except (IndexError, TypeError):
            obj = None
        if obj is not None and index >= 0:
            return obj
        return resolve(binding, index)
    return _outside_a_call(index, _RESOLVERS)


def _outside_a_call(index: int, resolvers: tuple[Callable[[int], Any], ...]) -> Any:
    """``index`` as the first of ``resolvers`` that knows the asker's context finds it."""
    if type(index) is not int:
        raise UserObjectError(
            f"torch_userstreams.lookup({index!r}): lookup takes a graph's integer table index "
            "(what new_stream(), new_event() or current_stream() returned while the graph "
            f"compiled), not a {type(index).__name__}; a stream's name is not an index."
        )
    for resolver in resolvers:
        found = resolver(index)
        if found is not None:
            return found
    raise UserObjectError(
        f"torch_userstreams.lookup({index!r}) was called outside any compiled call: user "
        "objects are only bound while a compiled graph (or its backward) runs."
        + compiled_autograd_hint()
    )


def lookup_all(indices: tuple[int, ...]) -> tuple[Any, ...]:
    """The current call's user objects at ``indices``, its binding found once: what a
    compiled call's code resolves at its start (a backward's binding takes a walk to the
    running autograd node, once per call rather than once per object). Anywhere else,
    each index as ``lookup`` finds it."""
    binding = state.calls.current
    if binding is None:
        binding = backward_binding()
    if binding is None:  # no call and no backward: what ``lookup`` tries after those
        return tuple(_outside_a_call(index, _RESOLVERS[1:]) for index in indices)
    if len(indices) > 1:  # the common case: one C call takes them all
        try:
            objects = (None,)
            if min(indices) >= 0:  # (item 0 of a binding is its graph)
                objects = operator.itemgetter(*[index + 1 for index in indices])(binding)
        except (IndexError, TypeError):  # past the end, or no int: said by ``resolve``
            pass
        if None not in objects:
            return objects  # type: ignore[no-any-return]
    return tuple(resolve(binding, index) for index in indices)  # or a clear error


def _in_backward(index: int) -> Any:
    binding = backward_binding()
    return None if binding is None else resolve(binding, index)


def _while_compiling(index: int) -> Any:
    compile_ = compile_in_progress()
    return None if compile_ is None else compile_.example(index)


def _exported(index: int) -> Any:
    exported = state.calls.exported
    return None if exported is None else exported.example(index)


_RESOLVERS = (_in_backward, _while_compiling, _exported, native.object_at)


def returned_object(index: int) -> Any:
    """The object at ``index`` of the call that just returned on this thread.

    The bytecode right after a graph call uses this to return a stream or event the graph
    created (``return y, torch.Stream(...)``); ``lookup`` only serves running calls.
    """
    binding = state.calls.last
    if binding is None:
        raise UserObjectError(
            f"torch_userstreams: no compiled call has returned on this thread, so user "
            f"object {index} cannot be returned from it."
        )
    return resolve(binding, index)


never_trace(returned_object, lookup, lookup_all)
