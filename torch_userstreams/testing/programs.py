"""Stream programs as data: rendered to Python source, executed into functions.

A ``Program`` is a small function over two leaf tensors ``x`` and ``w`` (both require grad)
and some streams, some passed in and some created locally. Keeping it as data lets
Hypothesis generate and shrink it, and lets the same program be rendered twice:

* compiled: local objects are ``torch.Stream`` / ``torch.Event`` (what Dynamo traces);
* eager: local objects are ``SimStream`` / ``SimEvent``, since native CPU events cannot
  record; stream inputs are always Sim objects (``Program.stream_inputs``).

On an accelerator (``device="cuda"``) there is no simulation: both renderings are native,
and the program is framed by a fork and a join with the ambient current stream, which
produced the inputs and consumes the results: every stream waits for the current stream
before the body, and the current stream waits for every stream before the return. Without
that frame a real device races even in eager (the inputs were written on the current
stream; the caller reads the results there). On CPU no sync can name the current stream,
and none is needed: the host runs everything in program order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ..simulator import SimEvent, SimStream

UNARY = {
    "sin": "{0}.sin()",
    "cos": "{0}.cos()",
    "tanh": "{0}.tanh()",
    "neg": "-{0}",
    "scale": "{0} * 0.5",
}
BINARY = {"add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}"}
INPLACE = {"add_": "{0}.add_({1})", "sub_": "{0}.sub_({1})", "mul_": "{0}.mul_(2.0)"}
LEAVES = ("x", "w")
# Read at each use, never kept in a local: Dynamo mishandles stream locals across a break.
CURRENT_STREAM = "torch.accelerator.current_stream(DEVICE)"


@dataclass(frozen=True)
class Op:
    """``dst = kind(args)``: a new tensor."""

    dst: str
    kind: str
    args: tuple[str, ...]

    def lines(self) -> Iterator[str]:
        table = UNARY if len(self.args) == 1 else BINARY
        yield f"{self.dst} = {table[self.kind].format(*self.args)}"


@dataclass(frozen=True)
class InPlace:
    """``args[0].kind_(args[1:])``: an in-place update of a non-leaf intermediate."""

    kind: str
    args: tuple[str, ...]

    def lines(self) -> Iterator[str]:
        yield INPLACE[self.kind].format(*self.args)


@dataclass(frozen=True)
class NewEvent:
    name: str

    def lines(self) -> Iterator[str]:
        yield f"{self.name} = Event(device=DEVICE)"


@dataclass(frozen=True)
class UserSync:
    """One sync call, as written by a user (``form`` is its Python spelling)."""

    form: str  # "record", "record_current", "wait", "wait_event", "wait_stream", ...
    args: tuple[str, ...]

    FORMS = {
        "record": "{0}.record({1})",  # event, stream
        "record_current": "{0}.record()",  # event: on the stream of the enclosing `with`
        "wait": "{0}.wait({1})",  # event, stream
        "wait_event": "{1}.wait_event({0})",  # event, stream
        "wait_stream": "{0}.wait_stream({1})",  # waiting, waited-on
        "synchronize_event": "{0}.synchronize()",  # event
        "synchronize_stream": "{0}.synchronize()",  # stream
    }

    def lines(self) -> Iterator[str]:
        yield self.FORMS[self.form].format(*self.args)


@dataclass(frozen=True)
class With:
    stream: str
    body: tuple[Statement, ...]

    def lines(self) -> Iterator[str]:
        yield f"with {self.stream}:"
        for statement in self.body or (Pass(),):
            for line in statement.lines():
                yield "    " + line


@dataclass(frozen=True)
class Pass:
    def lines(self) -> Iterator[str]:
        yield "pass"


@dataclass(frozen=True)
class GraphBreak:
    """Only outside ``with`` blocks: Dynamo drops code after a break inside one."""

    def lines(self) -> Iterator[str]:
        yield "torch._dynamo.graph_break()"


Statement = Op | InPlace | NewEvent | UserSync | With | Pass | GraphBreak


@dataclass(frozen=True)
class Program:
    """A generated stream program (see the module docstring)."""

    input_streams: tuple[str, ...]
    local_streams: tuple[str, ...]
    body: tuple[Statement, ...]
    outputs: tuple[str, ...]

    @property
    def streams(self) -> tuple[str, ...]:
        return (*self.input_streams, *self.local_streams)

    def source(self, *, eager: bool, device: str = "cpu", frame: bool | None = None) -> str:
        """The program as Python; ``frame`` (default: on an accelerator) adds the fork from
        and the join to the current stream (see the module docstring)."""
        simulated = eager and device == "cpu"
        stream, event = ("SimStream", "SimEvent") if simulated else ("torch.Stream", "torch.Event")
        params = ", ".join((*LEAVES, *self.input_streams))
        lines = [f"def program({params}):", f"    Event = {event}", f"    DEVICE = {device!r}"]
        lines += [f"    {name} = {stream}(device=DEVICE)" for name in self.local_streams]
        framed = device != "cpu" if frame is None else frame
        if framed:
            lines += ["    " + line for line in self.fork_lines()]
        for statement in self.body:
            lines += ["    " + line for line in statement.lines()]
        if framed:
            lines += ["    " + line for line in self.join_lines()]
        lines.append(f"    return ({', '.join(self.outputs)},)")
        return "\n".join(lines) + "\n"

    def fork_lines(self) -> list[str]:
        """Every stream waits for the current stream (which wrote the inputs)."""
        lines = ["forked = Event(device=DEVICE)", f"forked.record({CURRENT_STREAM})"]
        return lines + [f"forked.wait({name})" for name in self.streams]

    def join_lines(self) -> list[str]:
        """The current stream (which reads the results) waits for every stream."""
        lines = []
        for i, name in enumerate(self.streams):
            event = f"joined{i}"
            lines += [f"{event} = Event(device=DEVICE)", f"{event}.record({name})"]
            lines.append(f"{event}.wait({CURRENT_STREAM})")
        return lines

    def build(
        self, *, eager: bool, device: str = "cpu", frame: bool | None = None
    ) -> Callable[..., Any]:
        """The program as a function; ``eager`` on CPU picks the simulated local objects."""
        return build_source(self.source(eager=eager, device=device, frame=frame), eager=eager)

    def stream_inputs(self, device: str = "cpu") -> list[torch.Stream]:
        """Streams to pass in: simulated on CPU, native elsewhere."""
        if device == "cpu":
            return [SimStream(device="cpu") for _ in self.input_streams]
        return [torch.Stream(device=device) for _ in self.input_streams]

    def __str__(self) -> str:
        return self.source(eager=False)


def build_source(source: str, *, eager: bool) -> Callable[..., Any]:
    """The function ``program`` a rendered program source defines."""
    namespace: dict[str, Any] = {"torch": torch, "SimStream": SimStream, "SimEvent": SimEvent}
    name = f"<program {'eager' if eager else 'compiled'}>"
    exec(compile(source, name, "exec"), namespace)
    return namespace["program"]  # type: ignore[no-any-return]


def leaves(seed: int = 0, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh ``x`` and ``w`` (requiring grad), the same values for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(4, generator=generator).to(device).requires_grad_()
    w = torch.randn(4, generator=generator).to(device).requires_grad_()
    return x, w
