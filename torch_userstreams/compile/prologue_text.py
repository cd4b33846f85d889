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


def _step(stack: list[str], opname: str, arg: str) -> str | None:
    """Apply one instruction to ``stack``; return a finished statement, if it makes one."""
    if opname in _NO_VALUE:
        return None
    if opname in _LOADS:
        stack.append(arg)
    elif opname == "LOAD_CONST":  # ``render`` writes a constant's repr; None as nothing
        stack.append(arg or "None")
    elif opname in _ATTRIBUTES:
        stack.append(f"{stack.pop()}.{arg}")
    elif opname in _CALLS:
        count = int(arg or 0)
        args = [stack.pop() for _ in range(count)][::-1]
        stack.append(f"{stack.pop()}({', '.join(args)})")
    elif opname == "BINARY_SUBSCR":
        key = stack.pop()
        stack.append(f"{stack.pop()}[{key}]")
    elif opname == "BUILD_TUPLE":
        count = int(arg)
        items = [stack.pop() for _ in range(count)][::-1]
        if any("\0" in item for item in items):
            raise _Unknown("a tuple inside the binding")
        stack.append("\0".join(("(", *items)))  # split again by ``as_python``
    elif opname == "STORE_ATTR":
        target = stack.pop()
        return f"{target}.{arg} = {stack.pop()}"
    else:
        raise _Unknown(opname)
    return None


def as_python(listing: str, names: list[str]) -> str | None:
    """``listing`` (``prologue.render``'s text) as the Python statement it runs, each
    element of the binding on a line of its own with a comment from ``names`` (one per table
    entry, in index order); None where an instruction is not one this reading knows."""
    stack: list[str] = []
    statements: list[str] = []
    try:
        for line in listing.splitlines():
            opname, _, arg = line.strip().partition(" ")
            done = _step(stack, opname, arg.strip())
            if done is not None:
                statements.append(done)
    except (_Unknown, IndexError, ValueError):
        return None
    if stack or len(statements) != 1:
        return None
    target, _, value = statements[0].partition(" = ")
    if not value.startswith("(\0"):
        return None
    graph, *objects = value.split("\0")[1:]
    if len(objects) != len(names):
        return None
    lines = [f"{target} = (", f"    {graph},  # the graph"]
    lines += [f"    {obj},  # {name}" for obj, name in zip(objects, names, strict=True)]
    return "\n".join([*lines, ")"])
