"""A prologue's listing read back as Python, for people: ``explain(verbose=True)``.

The prologue is bytecode (``prologue.render`` lists it). Its shape is always one tuple
stored into the thread's pending binding, so a small stack reading of the listing gives the
statement it runs, one line per table entry. An instruction this reading does not know gives
None, and the caller shows the listing itself: never a wrong rendering.
"""

from __future__ import annotations

# Instructions that only change how a call is made, not what is called (3.11+).
_NO_VALUE = frozenset({"PUSH_NULL", "PRECALL", "RESUME", "NOP", "CACHE"})
_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_FAST", "LOAD_DEREF", "LOAD_NAME", "LOAD_CLOSURE"})
_ATTRIBUTES = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
_CALLS = frozenset({"CALL", "CALL_FUNCTION", "CALL_METHOD"})


class _Unknown(Exception):
    """An instruction this reading does not know."""


Value = str | tuple[str, ...]  # an expression, or the items of a tuple the code built


def _expression(value: Value) -> str:
    """An operand that must be an expression: a tuple used as one is not this prologue."""
    if isinstance(value, tuple):
        raise _Unknown("a tuple used as an operand")
    return value


def _step(stack: list[Value], opname: str, arg: str) -> tuple[str, Value] | None:
    """Apply one instruction to ``stack``; a ``STORE_ATTR`` gives (target, value) back."""
    if opname in _NO_VALUE:
        return None
    if opname in _LOADS:
        stack.append(arg)
    elif opname == "LOAD_CONST":  # ``render`` writes a constant's repr; None as nothing
        stack.append(arg or "None")
    elif opname in _ATTRIBUTES:
        stack.append(f"{_expression(stack.pop())}.{arg}")
    elif opname in _CALLS:
        args = [_expression(stack.pop()) for _ in range(int(arg or 0))][::-1]
        stack.append(f"{_expression(stack.pop())}({', '.join(args)})")
    elif opname == "BINARY_SUBSCR":
        key = _expression(stack.pop())
        stack.append(f"{_expression(stack.pop())}[{key}]")
    elif opname == "BUILD_TUPLE":
        stack.append(tuple(_expression(stack.pop()) for _ in range(int(arg)))[::-1])
    elif opname == "STORE_ATTR":
        target = _expression(stack.pop())
        return f"{target}.{arg}", stack.pop()
    else:
        raise _Unknown(opname)
    return None


def as_python(listing: str, names: list[str]) -> str | None:
    """``listing`` (``prologue.render``'s text) as the Python statement it runs, each
    element of the binding on a line of its own with a comment from ``names`` (one per table
    entry, in index order); None where an instruction is not one this reading knows."""
    stack: list[Value] = []
    stores: list[tuple[str, Value]] = []
    try:
        for line in listing.splitlines():
            opname, _, arg = line.strip().partition(" ")
            store = _step(stack, opname, arg.strip())
            if store is not None:
                stores.append(store)
    except (_Unknown, IndexError, ValueError):
        return None
    if stack or len(stores) != 1:
        return None
    target, binding = stores[0]
    if not isinstance(binding, tuple) or len(binding) != len(names) + 1:
        return None
    graph, *objects = binding
    lines = [f"{target} = (", f"    {graph},  # the graph"]
    lines += [f"    {obj},  # {name}" for obj, name in zip(objects, names, strict=True)]
    return "\n".join([*lines, ")"])
