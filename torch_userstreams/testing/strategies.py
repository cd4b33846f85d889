"""Hypothesis strategies of stream programs that are correct as written.

``programs()`` draws a ``Program``: 2-4 streams (inputs and locals), nested ``with``
blocks, ops on tensors that require grad, ``w`` used on two streams, in-place updates of
intermediates, graph breaks outside ``with`` blocks, and user syncs in every spelling.

A generated program is race-free in eager mode by construction, so any hazard in its
compiled graphs comes from the compiler or the package. The generator tracks the same
happens-before rules as the checker (``StreamClocks``), and:

* before an op on stream T touches a value written (or, for an in-place write, accessed)
  on another stream S without ordering, it emits a sync S -> T in a drawn spelling;
* values never cross between the ambient current stream (top-level code) and a side
  stream: on CPU no sync can name the current stream (``e.record()`` outside a ``with``
  fails in Dynamo);
* an in-place update only hits an intermediate autograd has not saved (else eager's
  backward would raise) and that was made after the last graph break (before it, the value
  is an input of the next graph: input mutations have their own test, in test_pass_graphs);
* before returning, a stream that allocated a value another stream used waits for that
  use (the value dies at the return, and its memory goes back to the allocating stream);
* extra syncs with no purpose are sprinkled in.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from .happens_before import StreamClocks
from .programs import (
    BINARY,
    INPLACE,
    LEAVES,
    UNARY,
    GraphBreak,
    InPlace,
    NewEvent,
    Op,
    Program,
    Statement,
    UserSync,
    With,
)

ALL_SYNC_FORMS = (
    "event",
    "wait_event",
    "wait_stream",
    "record_in_with",
    "synchronize_event",
    "synchronize_stream",
)
SAVES_INPUTS = {"mul", "sin", "cos"}
SAVES_OUTPUT = {"tanh"}
CURRENT: Hashable = None  # the ambient current stream (top-level code)


@dataclass
class _Value:
    name: str
    stream: Hashable  # allocating stream; CURRENT for top-level values
    accesses: list[tuple[Hashable, int, bool]] = field(default_factory=list)  # stream, tick, write
    saved: bool = False  # autograd keeps it, or a graph break made it an input: no in-place
    used: bool = False

    @property
    def side(self) -> bool:
        return self.stream is not CURRENT


class _Builder:
    """Draws one program, statement by statement, keeping it race-free."""

    def __init__(
        self, draw: Callable[[Any], Any], streams: list[str], forms: tuple[str, ...], max_ops: int
    ) -> None:
        self.draw = draw
        self.streams = streams
        self.forms = forms
        self.ops_left = max_ops
        self.clocks = StreamClocks()
        self.values: dict[str, _Value] = {}
        self.stack: tuple[str, ...] = ()  # the streams of the enclosing `with` blocks
        self.counter = 0
        self.stream_uses: dict[str, set[Hashable]] = {leaf: set() for leaf in LEAVES}

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    # -- syncs ------------------------------------------------------------------------

    def sync(self, out: list[Statement], source: str, target: str) -> None:
        """Emit a sync after which ``target``'s next work waits for ``source``'s work so far."""
        forms = self.forms
        if source in self.stack:  # re-entering an entered stream fails in Dynamo
            forms = tuple(f for f in forms if f != "record_in_with") or ("event",)
        form = self.draw(st.sampled_from(forms))
        event = self.fresh("e")
        if form == "wait_stream":
            out.append(UserSync("wait_stream", (target, source)))
            self.clocks.wait_stream(target, source)
            return
        if form == "synchronize_stream":
            out.append(UserSync("synchronize_stream", (source,)))
            self.clocks.synchronize_stream(source)
            return
        out.append(NewEvent(event))
        if form == "record_in_with":
            out.append(With(source, (UserSync("record_current", (event,)),)))
        else:
            out.append(UserSync("record", (event, source)))
        self.clocks.record(event, source)
        if form == "synchronize_event":
            out.append(UserSync("synchronize_event", (event,)))
            self.clocks.synchronize_event(event)
            return
        spelling = "wait_event" if form == "wait_event" else "wait"
        out.append(UserSync(spelling, (event, target)))
        self.clocks.wait_event(event, target)

    def order(self, out: list[Statement], value: _Value, stream: Hashable, write: bool) -> None:
        """Sync so that an access on ``stream`` comes after the conflicting earlier ones."""
        for other, tick, was_write in list(value.accesses):
            if (write or was_write) and not self.clocks.seen_by(stream, other, tick):
                assert other is not CURRENT and stream is not CURRENT, "no sync can do this"
                self.sync(out, str(other), str(stream))

    # -- values -----------------------------------------------------------------------

    def usable(self, stream: Hashable, *, inplace: bool = False) -> list[str]:
        """Values an op on ``stream`` may touch (leaves are inputs: never written here)."""
        names = [] if inplace else list(LEAVES)
        for value in self.values.values():
            if (value.stream is CURRENT) != (stream is CURRENT):
                continue
            if inplace and value.saved:
                continue
            names.append(value.name)
        return names

    def access(self, name: str, stream: Hashable, tick: int, *, write: bool) -> None:
        if name in LEAVES:
            self.stream_uses[name].add(stream)
            return
        value = self.values[name]
        value.accesses.append((stream, tick, write))
        value.used = True

    def op(self, out: list[Statement], stream: Hashable) -> None:
        kind = self.draw(st.sampled_from(sorted(UNARY) + sorted(BINARY)))
        arity = 1 if kind in UNARY else 2
        candidates = self.usable(stream)
        args = tuple(self.draw(st.sampled_from(candidates)) for _ in range(arity))
        for name in args:
            if name not in LEAVES:
                self.order(out, self.values[name], stream, write=False)
        tick = self.clocks.issue(stream)[stream]
        dst = self.fresh("v")
        for name in args:
            self.access(name, stream, tick, write=False)
            if kind in SAVES_INPUTS and name not in LEAVES:
                self.values[name].saved = True
        self.values[dst] = _Value(dst, stream, [(stream, tick, True)], saved=kind in SAVES_OUTPUT)
        out.append(Op(dst, kind, args))
        self.ops_left -= 1

    def inplace(self, out: list[Statement], stream: Hashable) -> bool:
        targets = self.usable(stream, inplace=True)
        if not targets:
            return False
        target = self.draw(st.sampled_from(targets))
        kind = self.draw(st.sampled_from(sorted(INPLACE)))
        operands = [] if kind == "mul_" else [self.draw(st.sampled_from(self.usable(stream)))]
        self.order(out, self.values[target], stream, write=True)
        for name in operands:
            if name not in LEAVES:
                self.order(out, self.values[name], stream, write=False)
        tick = self.clocks.issue(stream)[stream]
        for name in operands:
            self.access(name, stream, tick, write=False)
        self.access(target, stream, tick, write=True)
        out.append(InPlace(kind, (target, *operands)))
        self.ops_left -= 1
        return True

    # -- blocks -----------------------------------------------------------------------

    def block(self, stack: tuple[str, ...]) -> list[Statement]:
        """The statements of a block inside the ``with`` blocks ``stack`` (innermost last)."""
        out: list[Statement] = []
        for _ in range(self.draw(st.integers(1, 4))):
            if self.ops_left <= 0:
                break
            self.statement(out, stack)
        return out

    def statement(self, out: list[Statement], stack: tuple[str, ...]) -> None:
        stream: Hashable = stack[-1] if stack else CURRENT
        # Dynamo fails ("multiple exits?") on re-entering a stream already entered.
        free = [s for s in self.streams if s not in stack]
        choices = ["op", "op", "sync"]
        if free and len(stack) < 3:
            choices += ["with", "with"] if stream is CURRENT else ["with"]
        if stream is not CURRENT:
            choices.append("inplace")
        choice = self.draw(st.sampled_from(choices))
        if choice == "with":
            inner = self.draw(st.sampled_from(free))
            self.stack = (*stack, inner)
            body = self.block(self.stack)
            self.stack = stack
            out.append(With(inner, tuple(body)))
        elif choice == "sync":
            source, target = self.draw(st.permutations(self.streams))[:2]
            self.sync(out, source, target)
        elif choice == "inplace" and self.inplace(out, stream):
            pass
        else:
            self.op(out, stream)

    def graph_break(self, out: list[Statement]) -> None:
        out.append(GraphBreak())
        for value in self.values.values():
            value.saved = True

    def use_w_on_two_streams(self, out: list[Statement]) -> None:
        """``w`` is a parameter used on two streams: its gradient accumulates across them."""
        used = {s for s in self.stream_uses["w"] if s is not CURRENT}
        for stream in [s for s in self.streams if s not in used][: max(0, 2 - len(used))]:
            dst = self.fresh("v")
            tick = self.clocks.issue(stream)[stream]
            self.access("w", stream, tick, write=False)
            self.values[dst] = _Value(dst, stream, [(stream, tick, True)], saved=False)
            out.append(With(stream, (Op(dst, "scale", ("w",)),)))

    def outputs(self) -> tuple[str, ...]:
        """Every value no later op used, so the backward runs through every op."""
        sinks = [v.name for v in self.values.values() if not v.used]
        return tuple(sinks) or ("w",)

    def join(self, out: list[Statement], outputs: tuple[str, ...]) -> None:
        """Before returning: allocating streams wait for other streams' uses of dying values."""
        for value in self.values.values():
            if value.name in outputs or not value.side:
                continue
            for other, tick, _ in value.accesses:
                if not self.clocks.seen_by(value.stream, other, tick):
                    self.sync(out, str(other), str(value.stream))


@st.composite
def programs(
    draw: Callable[[Any], Any],
    *,
    max_streams: int = 4,
    max_ops: int = 7,
    graph_breaks: bool = True,
    sync_forms: tuple[str, ...] | None = None,
) -> Program:
    """Draw a race-free stream program (see the module docstring)."""
    count = draw(st.integers(2, max_streams))
    is_input = [draw(st.booleans()) for _ in range(count)]
    streams = [f"s{i}" for i in range(count)]
    builder = _Builder(draw, streams, sync_forms or ALL_SYNC_FORMS, max_ops)
    # After a graph break in a frame that entered a local stream, Dynamo cannot resume
    # ("annotate escaped") and runs the rest eagerly, where CPU events cannot record.
    breaks = graph_breaks and all(is_input)
    body: list[Statement] = []
    while builder.ops_left > 0:
        body.extend(builder.block(()))
        if breaks and builder.ops_left > 0 and draw(st.integers(0, 3)) == 0:
            builder.graph_break(body)
    builder.use_w_on_two_streams(body)
    outputs = builder.outputs()
    builder.join(body, outputs)
    return Program(
        input_streams=tuple(s for s, inp in zip(streams, is_input, strict=True) if inp),
        local_streams=tuple(s for s, inp in zip(streams, is_input, strict=True) if not inp),
        body=tuple(body),
        outputs=outputs,
    )
