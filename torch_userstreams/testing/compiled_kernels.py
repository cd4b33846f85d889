"""Inductor's compiled code as the race detector sees it: kernel by kernel where it can.

A call of Inductor's generated code runs kernels the dispatcher never sees (its C++
kernels), beside ones it does (``extern_kernels.mm``, aten fallbacks). Native Inductor
2.12+ runs one call per graph however many streams the graph uses, entering each stream
block inside the call, so one call cannot count as one kernel on one stream: a race
between two of its kernels, or a missing sync inside it, would go unseen.

``seen_kernel_by_kernel`` therefore replaces, for the block, each C++ kernel in a compiled
module's namespace with one that tells the running observer (``observe.watcher()``) what it
reads and writes before it runs, on the stream the code entered last. Which pointer
arguments a kernel writes is read from its definition in the module's source
(``name = async_compile.cpp_pybinding(['const float*', 'float*', ...], ...)``: a
``const`` pointer is only read; an in-place one is written, so a race on it is reported as
write-after-write where it is also read-after-write). A kernel already watched (a nested
block) is not wrapped again. Code it cannot see into that way (a module whose call is not
its own ``call``, one that defines a GPU or Halide kernel) counts as one kernel on the
stream current at the call, reading its inputs and writing its outputs and the inputs it
mutates, as before.

Either way, what a graph's call returns is the caller's memory (``Observer.escape``), as it
is for the package's own compiled programs and in the static checker; a region of such a
program (``observe.part_of_a_program``) hands its outputs to the program's next steps.
"""

from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ..observe import Observer, outputs_escape, tensors_in, watcher

# One C++ kernel's definition in Inductor's generated Python module (2.11-2.15).
_DEFINITION = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\((\[[^\]]*\])", re.MULTILINE)
# Any kernel's definition (``triton``, ``halide``, ``cpp_pybinding``...).
_ANY_KERNEL = re.compile(r"^\w+ = async_compile\.(\w+)\(", re.MULTILINE)
_WATCHED = "_torch_userstreams_watched"

Kernel = Callable[..., Any]


def written_arguments(source: str) -> dict[str, tuple[bool | None, ...]]:
    """Each C++ kernel the module ``source`` defines, with what it does to each argument:
    True writes through a pointer, False reads through a ``const`` one, None is no tensor."""
    kernels: dict[str, tuple[bool | None, ...]] = {}
    for name, types in _DEFINITION.findall(source):
        kernels[name] = tuple(
            None if not kind.endswith("*") else not kind.startswith("const ")
            for kind in ast.literal_eval(types)
        )
    return kernels


def watched(name: str, native: Kernel, writes: tuple[bool | None, ...]) -> Kernel:
    """``native``, first telling the running observer (if any) what it accesses."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        observer = watcher()
        if observer is not None:
            tensors = [arg for arg in (*args, *kwargs.values()) if isinstance(arg, torch.Tensor)]
            if len(args) == len(writes) and not kwargs:
                read = [arg for arg, w in zip(args, writes, strict=True) if w is False]
                written = [arg for arg, w in zip(args, writes, strict=True) if w]
            else:  # not as defined: every tensor it is given may be written
                read, written = [], tensors
            observer.kernel(name, read, written)
        return native(*args, **kwargs)

    kernel.__wrapped__ = native  # type: ignore[attr-defined]
    setattr(kernel, _WATCHED, True)
    return kernel


def _namespace(compiled: Any) -> dict[str, Any] | None:
    """The generated module's globals, where its call is that module's ``call`` (a function
    of it, or its ``Runner``'s method); None where torch wrapped the call in code of its own
    (whose globals are torch's), or the module defines a kernel other than a C++ one."""
    call = getattr(compiled, "current_callable", None)
    function = getattr(call, "__func__", call)
    namespace = getattr(function, "__globals__", None)
    if not isinstance(namespace, dict):
        return None
    own = namespace.get("call")
    if getattr(own, "__func__", own) is not function:
        return None
    kinds = set(_ANY_KERNEL.findall(str(getattr(compiled, "source_code", ""))))
    return namespace if kinds <= {"cpp_pybinding"} else None


class KernelView:
    """The modules one block sees into, and how to put them back."""

    def __init__(self) -> None:
        self._seen: dict[int, bool] = {}  # id(namespace) -> whether it is watched
        self._restore: list[tuple[dict[str, Any], str, Kernel]] = []
        self._kept: list[dict[str, Any]] = []  # keeps each id above unique while watched

    def watch(self, compiled: Any) -> bool:
        """Watch each kernel of ``compiled``'s module; whether the module is seen kernel by
        kernel (a module with no C++ kernel is: all it runs, the dispatcher sees)."""
        namespace = _namespace(compiled)
        if namespace is None:
            return False
        if id(namespace) not in self._seen:
            self._kept.append(namespace)
            kernels = written_arguments(compiled.source_code)
            self._seen[id(namespace)] = all(name in namespace for name in kernels)
            for name, writes in kernels.items():
                native = namespace.get(name)
                if native is not None and not getattr(native, _WATCHED, False):
                    self._restore.append((namespace, name, native))
                    namespace[name] = watched(name, native, writes)
        return self._seen[id(namespace)]

    def restore(self) -> None:
        """Every kernel as it was."""
        for namespace, name, native in reversed(self._restore):
            namespace[name] = native
        self._restore.clear()
        self._seen.clear()
        self._kept.clear()


# (what the call reads, the inputs it mutates, what it returns)
WholeCall = Callable[[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]], None]


@contextlib.contextmanager
def seen_kernel_by_kernel(observer: Observer, whole_call: WholeCall) -> Iterator[None]:
    """For the block, each call of Inductor's compiled code tells ``observer`` its kernels
    (the module docstring), or, where the code cannot be seen into, calls ``whole_call``
    with the inputs it reads, those it mutates and what it returns. Then its outputs escape
    (unless it is part of a program)."""
    from torch._inductor.output_code import CompiledFxGraph

    native = CompiledFxGraph.__call__
    view = KernelView()

    def call(self: CompiledFxGraph, inputs: Sequence[Any]) -> Any:
        args = list(inputs)  # boxed: the callee clears the list
        by_kernel = view.watch(self)
        out = native(self, inputs)
        if not by_kernel:
            mutated = getattr(self, "mutated_input_idxs", ())
            tensors = [(i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
            reads = [a for i, a in tensors if i not in mutated]
            whole_call(reads, [a for i, a in tensors if i in mutated], tensors_in(out))
        if outputs_escape(self):
            observer.escape(out)
        return out

    CompiledFxGraph.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        CompiledFxGraph.__call__ = native  # type: ignore[method-assign]
        view.restore()
