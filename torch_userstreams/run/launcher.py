"""A ``plan.Program`` as one generated Python function: its launcher.

Interpreting a program per call (an argument template per step, a lookup per stream entered
and per sync, each sync through an issuer function) costs the host more than the graph's own
work on small steps. The launcher is the same program written out once per compile as
straight-line code, in the manner of Inductor's wrapper:

    def launch(v0, v1):
        o2 = lookup(2)            # each user object the graph uses, once per call
        o3 = lookup(3)
        with o2:                  # a region (or node) on its stream
            v4 = c0(v0, v1)
        v1 = None                 # a value dropped after its last use
        o3.record(o2)             # a sync: the method of the call's own object
        o3.wait(None)
        return (v4,)

Each kind of step writes its own lines (``_sync_line``, ``_call_line``); values live in local
variables; callables and constants are the function's globals. A step that raises is found
from the traceback's line, so the happy path pays nothing to be diagnosed.

The code is compiled once and bound to two sets of globals: ``launch`` calls each step's
``direct`` entry where it has one (an Inductor graph's generated ``call``, without
``CompiledFxGraph.__call__``'s per-call bookkeeping), ``launch_watched`` each step's full
entry, for the calls someone watches (a race detector, the profiler, Inductor's
execution-order recording) and the first call.
"""

from __future__ import annotations

import itertools
import keyword
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..fx.ops import OBJECT_ROLES, SYNC_METHODS, SYNC_ROLES
from .issue_syncs import ISSUERS
from .lookup import lookup
from .steps import Ref, Step

_NAME_OF_ISSUER: dict[Callable[..., None], str] = {issue: name for name, issue in ISSUERS.items()}


@dataclass
class _Source:
    """The launcher being written: its lines, its globals, and which step each line runs."""

    lines: list[str]
    names: dict[str, Any]
    step_of_line: dict[int, int]
    objects: dict[int, str]
    direct: dict[str, Any]

    def constant(self, value: Any) -> str:
        """A global name for ``value`` (a callable, a constant of a template)."""
        name = f"k{len(self.names)}"
        self.names[name] = value
        return name

    def object(self, index: Any) -> str:
        """The local holding the call's user object ``index``, resolved once per call; an
        index that is no table index is looked up where it is used, which says why."""
        if type(index) is not int or index < 0:
            return f"lookup({index!r})"
        return self.objects.setdefault(index, f"o{index}")

    def emit(self, line: str, step: int, indent: int = 1) -> None:
        self.lines.append("    " * indent + line)
        self.step_of_line[len(self.lines)] = step


def value(template: Any, source: _Source) -> str:
    """The expression that builds ``template`` (``Ref``s are locals) at run time."""
    if type(template) is Ref:
        return f"v{template.slot}"
    if isinstance(template, tuple):
        items = "".join(f"{value(item, source)}, " for item in template)
        return f"({items})"
    if isinstance(template, list):
        return "[" + ", ".join(value(item, source) for item in template) + "]"
    if isinstance(template, dict):
        pairs = (f"{value(k, source)}: {value(v, source)}" for k, v in template.items())
        return "{" + ", ".join(pairs) + "}"
    if template is None or type(template) in (bool, int, str):
        return repr(template)
    return source.constant(template)


def _sync_line(step: Step, source: _Source) -> str | None:
    """``step`` as a method call on the call's objects, or None (issued as a call)."""
    name = _NAME_OF_ISSUER.get(step.call, "")
    pattern = SYNC_METHODS.get(name)
    roles = SYNC_ROLES.get(name, ())
    if pattern is None or step.kwargs or len(step.args) != len(roles):
        return None
    if any(
        role in OBJECT_ROLES and not _is_index(arg)
        for role, arg in zip(roles, step.args, strict=True)
    ):
        return None
    names = {
        role: source.object(arg) if role in OBJECT_ROLES else value(arg, source)
        for role, arg in zip(roles, step.args, strict=True)
    }
    return pattern.format(**names)


def _is_index(arg: Any) -> bool:
    return type(arg) is int and arg >= 0


def _call_line(step: Step, source: _Source) -> str:
    args = [value(arg, source) for arg in step.args]
    for key, arg in (step.kwargs or {}).items():
        named = key.isidentifier() and not keyword.iskeyword(key)
        args.append(
            f"{key}={value(arg, source)}" if named else f"**{{{key!r}: {value(arg, source)}}}"
        )
    callee = source.constant(step.call)
    if step.direct is not None:
        source.direct[callee] = step.direct
    if step.boxed:
        if step.kwargs:
            raise ValueError(f"a boxed step takes no keyword arguments: {step}")
        call = f"{callee}([{', '.join(args)}])"
    else:
        call = f"{callee}({', '.join(args)})"
    if step.output is not None:
        return f"v{step.output} = {call}"
    if step.outputs:
        return ", ".join(f"v{slot}" for slot in step.outputs) + f", = {call}"
    return call


def _step_lines(index: int, step: Step, source: _Source) -> None:
    line = None if step.outputs or step.boxed else _sync_line(step, source)
    if line is None:
        lines = [_call_line(step, source)]
    else:  # a sync's value (the executor keeps one per node) is None
        lines = [line] if step.output is None else [line, f"v{step.output} = None"]
    if step.stream is None:
        for line in lines:
            source.emit(line, index)
    else:
        source.emit(f"with {source.object(step.stream)}:", index)
        for line in lines:
            source.emit(line, index, indent=2)
    for slot in step.frees:
        source.emit(f"v{slot} = None", index)


@dataclass(frozen=True)
class Launcher:
    """A program's generated function (``launch(*inputs)``; ``launch_watched``, the same
    code calling each step's full entry), its source, and the step each of its lines issues
    (for diagnosing a step that raised)."""

    launch: Callable[..., Any]
    launch_watched: Callable[..., Any]
    source: str
    step_of_line: dict[int, int]


_counter = itertools.count()


def generate(inputs: list[int], steps: list[Step], output: Any) -> Launcher:
    """The launcher of a program with these input slots, steps and output template."""
    source = _Source([], {}, {}, {}, {})
    for index, step in enumerate(steps):
        _step_lines(index, step, source)
    result = value(output, source)
    body = source.lines
    resolve = [f"    {name} = lookup({index})" for index, name in source.objects.items()]
    params = ", ".join(f"v{slot}" for slot in inputs)
    header = [f"def launch({params}):", *resolve]
    offset = len(header)
    lines = [*header, *body, f"    return {result}"]
    text = "\n".join(lines) + "\n"
    filename = f"<torch_userstreams launcher {next(_counter)}>"
    namespace: dict[str, Any] = {"lookup": lookup, **source.names}
    exec(compile(text, filename, "exec"), namespace)
    watched = namespace["launch"]
    launch = watched
    if source.direct:
        launch = types.FunctionType(watched.__code__, {**namespace, **source.direct}, "launch")
    step_of_line = {line + offset: step for line, step in source.step_of_line.items()}
    return Launcher(launch, watched, text, step_of_line)


def failed_step(launcher: Launcher, exc: BaseException) -> int | None:
    """The step of ``launcher`` that raised ``exc``, from the innermost traceback entry in the
    launcher's code (None: raised while resolving the call's objects, or elsewhere)."""
    code: types.CodeType = launcher.launch.__code__
    found = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            found = launcher.step_of_line.get(tb.tb_lineno)
        tb = tb.tb_next
    return found
