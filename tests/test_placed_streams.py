"""``inductor.placed_streams``: on torch 2.11 the package places each node of a graph with
user streams on its stream (Inductor 2.12+ does it itself).

The stream blocks' nesting with device guards is written only for GPU tensors, which the
CPU suite never compiles: it is checked here on a scheduler's and wrapper's stand-ins that
call the package's hooks as Inductor 2.11's ``Scheduler._codegen`` does (each node's
``enter_context``, then a device guard where the node's device changes)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch._inductor.utils import IndentedBuffer

from torch_userstreams.inductor import placed_streams
from torch_userstreams.inductor.placed_streams import StreamBlocks


@dataclasses.dataclass
class _Guard:
    device: int | None  # None: the guard's exit

    def codegen(self, code: IndentedBuffer) -> None:
        if self.device is None:
            code.do_unindent()
            return
        code.writeline(f"with device_guard({self.device}):")
        code.do_indent()


@dataclasses.dataclass
class _Node:
    name: str
    stream: int | None
    device: str = "cuda"
    sync: bool = False


class _Wrapper:
    def __init__(self) -> None:
        self.lines: list[Any] = []

    def writeline(self, line: Any) -> None:
        self.lines.append(line)

    def codegen_device_guard_enter(self, device: int) -> None:
        self.lines.append(_Guard(device))

    def codegen_device_guard_exit(self) -> None:
        self.lines.append(_Guard(None))


class _Scheduler:
    """Inductor 2.11's ``_codegen`` loop, reduced to what it writes around each node."""

    def __init__(self, wrapper: _Wrapper) -> None:
        self.wrapper = wrapper
        self.pending: list[str] = []  # what a C++ kernel gathered, written when flushed

    def enter_context(self, node: _Node) -> None:
        pass

    def flush(self) -> None:
        if self.pending:
            self.wrapper.writeline(f"kernel({', '.join(self.pending)})")
            self.pending = []

    def codegen(self, nodes: list[_Node]) -> None:
        device = None
        for node in nodes:
            self.enter_context(node)
            if node.device != device:
                self.flush()
                if device == "cuda":
                    self.wrapper.codegen_device_guard_exit()
                device = node.device
                if device == "cuda":
                    self.wrapper.codegen_device_guard_enter(0)
            if node.device == "cpu":
                self.pending.append(node.name)
            else:
                self.wrapper.writeline(f"{node.name}(stream=get_raw_stream(0))")
        if device == "cuda":
            self.wrapper.codegen_device_guard_exit()
        self.flush()


def _code(nodes: list[_Node], monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(placed_streams, "stream_index", lambda node: node.stream)
    monkeypatch.setattr(placed_streams, "runs_nothing", lambda node: node.sync)
    wrapper = _Wrapper()
    scheduler = _Scheduler(wrapper)
    numbers = placed_streams.numbered(nodes)  # type: ignore[arg-type]
    with StreamBlocks(scheduler, wrapper, numbers).around_guards():
        scheduler.codegen(nodes)
    code = IndentedBuffer()
    for line in wrapper.lines:
        if isinstance(line, str):
            code.writeline(line)
        else:
            line.codegen(code)
    text = code.getvalue()
    compile(text, "<call>", "exec")  # every block holds code, every guard nests
    return text


def test_a_side_stream_block_opens_inside_the_device_guard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first GPU node opens its block before Inductor enters the device guard: the
    block is taken out there and entered inside the guard, and a kernel in it fetches the
    raw stream of the block's stream. A sync stays in the block open."""
    nodes = [
        _Node("a", 3),
        _Node("b", 3),
        _Node("record", None, sync=True),
        _Node("c", None),
        _Node("d", 5),
    ]
    assert _code(nodes, monkeypatch) == (
        "with device_guard(0):\n"
        "    with user_object3:\n"
        "        a(stream=get_raw_stream(0))\n"
        "        b(stream=get_raw_stream(0))\n"
        "        record(stream=get_raw_stream(0))\n"
        "    c(stream=get_raw_stream(0))\n"
        "    with user_object5:\n"
        "        d(stream=get_raw_stream(0))\n"
    )


def test_a_device_change_leaves_the_block_and_enters_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CPU node between GPU nodes of one stream: the guard's exit and enter happen outside
    the block, which is entered again around the CPU kernel (flushed inside it) and inside
    the next guard."""
    nodes = [_Node("a", 3), _Node("host", 3, device="cpu"), _Node("b", 3)]
    assert _code(nodes, monkeypatch) == (
        "with device_guard(0):\n"
        "    with user_object3:\n"
        "        a(stream=get_raw_stream(0))\n"
        "with user_object3:\n"
        "    kernel(host)\n"
        "with device_guard(0):\n"
        "    with user_object3:\n"
        "        b(stream=get_raw_stream(0))\n"
    )


def test_cpu_kernels_gathered_on_one_stream_are_written_in_its_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The C++ backend writes a kernel when flushed: each block flushes what it gathered
    before it is left, so no kernel runs in the next stream's block."""
    nodes = [_Node("a", 3, "cpu"), _Node("b", 3, "cpu"), _Node("c", None, "cpu")]
    assert _code(nodes, monkeypatch) == "with user_object3:\n    kernel(a, b)\nkernel(c)\n"


def test_side_streams_are_numbered_in_order_of_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As Inductor 2.12+ numbers its own (0 is the stream the call began on)."""
    monkeypatch.setattr(placed_streams, "stream_index", lambda node: node.stream)
    monkeypatch.setattr(placed_streams, "runs_nothing", lambda node: node.sync)
    nodes = [_Node("a", 7), _Node("b", None), _Node("s", 9, sync=True), _Node("c", 4)]
    assert placed_streams.numbered(nodes) == {1: 7, 2: 4}  # type: ignore[arg-type]


@pytest.mark.parametrize("placed", [True, False])
def test_nodes_of_two_streams_are_never_fused(
    placed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a graph the package places; native ``backend="inductor"``'s graphs keep 2.11's one
    stream, and its fusion."""
    from types import SimpleNamespace

    from torch._inductor.virtualized import V

    monkeypatch.setattr(placed_streams, "stream_index", lambda node: node.stream)
    can_fuse = placed_streams.wrap_can_fuse(lambda self, a, b, *rest: True)
    graph = SimpleNamespace(module=SimpleNamespace(meta={placed_streams.PLACED: placed}))
    with V.set_graph_handler(graph):  # type: ignore[arg-type]
        assert can_fuse(None, _Node("a", 3), _Node("b", None)) is not placed
        assert can_fuse(None, _Node("a", 3), _Node("b", 3))


def test_a_nodes_stream_is_that_of_the_fx_node_that_made_its_buffer() -> None:
    """Its ``origin_node``, else the last of its origins in graph order."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    first = graph.call_function(torch.sin, (x,))
    second = graph.call_function(torch.cos, (first,))
    first.meta["custom"] = {"stream": 2}
    second.meta["custom"] = {"stream": 5}

    @dataclasses.dataclass
    class Operation:
        origin_node: torch.fx.Node | None
        origins: set[torch.fx.Node]

        def get_origins(self) -> set[torch.fx.Node]:
            return self.origins

    @dataclasses.dataclass
    class SchedulerNode:
        node: Operation

        def get_nodes(self) -> list[SchedulerNode]:
            return [self]

    stream_index = placed_streams.stream_index
    assert stream_index(SchedulerNode(Operation(first, {first, second}))) == 2
    assert stream_index(SchedulerNode(Operation(None, {first, second}))) == 5
    assert stream_index(SchedulerNode(Operation(None, set()))) is None


def _annotated_graph() -> tuple[torch.fx.Graph, list[torch.fx.Node]]:
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    mm = graph.call_function(torch.mm, (x, x))
    add = graph.call_function(torch.add, (mm, x))
    graph.output(add)
    return graph, [mm, add]


def test_a_pattern_never_matches_nodes_of_two_streams() -> None:
    """2.11 discards a match whose nodes' mutation regions differ: the region now names
    the node's stream too (``inductor.pattern_streams``)."""
    from torch_userstreams.inductor.pattern_streams import wrap_get_mutation_region_id

    graph, (mm, add) = _annotated_graph()
    region = wrap_get_mutation_region_id(lambda graph, node: 0)
    assert region(graph, mm) == region(graph, add)
    mm.meta["custom"] = {"stream": 3}
    assert region(graph, mm) != region(graph, add)
    add.meta["custom"] = {"stream": 3}
    assert region(graph, mm) == region(graph, add)


@pytest.mark.parametrize("streams", [(3, 3), (3, None), (None, None)])
def test_a_replacement_runs_on_the_stream_of_what_it_replaces(
    streams: tuple[int | None, int | None],
) -> None:
    """The demo's backward ``mm`` and ``add`` on a side stream became an ``addmm`` with no
    annotation, on the current stream; now it keeps the side stream (a match of mixed
    streams, which the region check discards, is left as it is)."""
    from torch_userstreams.fx.meta import stream_of
    from torch_userstreams.inductor.pattern_streams import wrap_replace_with_graph

    graph, matched = _annotated_graph()
    for node, stream in zip(matched, streams, strict=True):
        if stream is not None:
            node.meta["custom"] = {"stream": stream}

    def native(match: Any, graph: torch.fx.Graph, replacement: Any, args: Any) -> None:
        mm, add = match.nodes
        with graph.inserting_before(add):
            addmm = graph.call_function(torch.addmm, (args[0], args[0], args[0]))
        add.replace_all_uses_with(addmm)
        graph.erase_node(add)
        graph.erase_node(mm)

    @dataclasses.dataclass
    class Match:
        nodes: list[torch.fx.Node]

    wrap_replace_with_graph(native)(Match(matched), graph, None, [next(iter(graph.nodes))])
    (addmm,) = graph.find_nodes(op="call_function", target=torch.addmm)
    assert stream_of(addmm) == (3 if streams == (3, 3) else None)


def test_before_a_sync_a_constant_is_left_to_its_readers(monkeypatch: pytest.MonkeyPatch) -> None:
    """What later nodes read is computed before a sync, except a value that reads nothing
    and draws no random number (the zero of a ReLU's backward): computed in a kernel of its
    own, it cost the demo's backward one kernel, where its readers can compute it."""
    aten = torch.ops.aten
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    zero = graph.call_function(aten.full.default, ([], 0.0))
    noise = graph.call_function(aten.rand.default, ([4],))
    relu = graph.call_function(aten.relu.default, (x,))
    later = graph.call_function(aten.where.self, (relu, zero, noise))
    negated = graph.call_function(aten.neg.default, (relu,))
    graph.output((later, negated))
    realized: list[Any] = []
    monkeypatch.setattr(placed_streams, "_realize", realized.append)
    env = {node: node for node in (x, zero, noise, relu)}  # lowered before the sync
    settled: set[Any] = set()
    placed_streams._realize_what_later_nodes_read(env, settled)
    assert realized == [noise, relu]
    # A later sync of the same graph looks only at what was lowered since: ``noise`` and
    # ``relu``, still read later, are in their buffers already and not realized again.
    assert settled == set(env)
    env[negated] = negated
    placed_streams._realize_what_later_nodes_read(env, settled)
    assert realized == [noise, relu, negated]
