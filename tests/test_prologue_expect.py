"""Golden prologues and graphs: what the package emits, frozen as inline expectations.

Regenerate with ``EXPECTTEST_ACCEPT=1 python -m pytest tests/test_prologue_expect.py`` and
review the diff before committing.
"""

from __future__ import annotations

import re
from typing import Any

import expecttest
import torch
import torch.fx

import torch_userstreams
from torch_userstreams.simulator import SimStream

# How each Python spells "call a function" differs (3.10: CALL_FUNCTION; 3.11: PRECALL,
# CALL; 3.12+: CALL); the expectations use CALL alone.
_CALL_PROTOCOL = (
    (re.compile(r"^(\s*)CALL_FUNCTION (\d+)$", re.M), r"\1CALL \2"),
    (re.compile(r"^\s*(PRECALL \d+|PUSH_NULL)\n", re.M), ""),
)


def normalized(text: str) -> str:
    """Strip addresses, ids, trailing spaces and the call protocol of the running Python, so
    the text is the same across runs and Python versions."""
    text = re.sub(r"0x[0-9a-f]+", "0x…", text)
    text = re.sub(r"\[\d+/\d+\]", "[n/n]", text)
    text = "\n".join(line.rstrip() for line in text.splitlines())
    for pattern, replacement in _CALL_PROTOCOL:
        text = pattern.sub(replacement, text)
    return text


def report(fn: Any, *args: Any, backend: Any = "eager") -> str:
    torch._dynamo.reset()
    text = torch_userstreams.explain(fn, *args, backend=backend).text(verbose=True, bytecode=True)
    return normalized(text.split("\nlegend:")[0])  # the legend is the same for every report


def uses_input_stream(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    with s:
        return x + 1


def makes_stream(x: torch.Tensor) -> torch.Tensor:
    side = torch.Stream(device="cpu")
    with side:
        return x + 1


def makes_event(x: torch.Tensor, s: torch.Stream) -> torch.Tensor:
    done = torch.Event(device="cpu")
    done.record(s)
    return x + 1


class TestPrologue(expecttest.TestCase):
    def setUp(self) -> None:
        torch_userstreams.install()

    def tearDown(self) -> None:
        torch_userstreams.uninstall()
        torch._dynamo.reset()

    def test_stream_input(self) -> None:
        self.assertExpectedInline(
            report(uses_input_stream, torch.ones(1), SimStream(device="cpu")),
            """\
1 graph(s), 0 graph break(s)
user objects of graph uses_input_stream [n/n]: 1
  [0] input          forward  SimStream    L['s']  (added by dynamo)
prologue, before each call:
  __userstreams_thread.calls.pending = (
      __userstreams_graph,  # the graph
      s,  # [0] L['s']
  )
prologue bytecode:
  LOAD_GLOBAL __userstreams_graph
  LOAD_FAST s
  BUILD_TUPLE 2
  LOAD_GLOBAL __userstreams_thread
  LOAD_ATTR calls
  STORE_ATTR pending""",
        )

    def test_local_stream(self) -> None:
        self.assertExpectedInline(
            report(makes_stream, torch.ones(1)),
            """\
1 graph(s), 0 graph break(s)
user objects of graph makes_stream [n/n]: 1
  [0] graph-created  forward  Stream       torch.Stream(device='cpu') in the function  (added by dynamo)
prologue, before each call:
  __userstreams_thread.calls.pending = (
      __userstreams_graph,  # the graph
      __userstreams_factory(),  # [0] torch.Stream(device='cpu') in the function
  )
prologue bytecode:
  LOAD_GLOBAL __userstreams_graph
  LOAD_GLOBAL __userstreams_factory
  CALL 0
  BUILD_TUPLE 2
  LOAD_GLOBAL __userstreams_thread
  LOAD_ATTR calls
  STORE_ATTR pending""",
        )

    def test_local_event(self) -> None:
        self.assertExpectedInline(
            report(makes_event, torch.ones(1), SimStream(device="cpu")),
            """\
1 graph(s), 0 graph break(s)
user objects of graph makes_event [n/n]: 2
  [0] graph-created  forward  Event        torch.Event(device='cpu') in the function  (added by dynamo)
  [1] input          forward  SimStream    L['s']  (added by dynamo)
prologue, before each call:
  __userstreams_thread.calls.pending = (
      __userstreams_graph,  # the graph
      __userstreams_factory(),  # [0] torch.Event(device='cpu') in the function
      s,  # [1] L['s']
  )
prologue bytecode:
  LOAD_GLOBAL __userstreams_graph
  LOAD_GLOBAL __userstreams_factory
  CALL 0
  LOAD_FAST s
  BUILD_TUPLE 3
  LOAD_GLOBAL __userstreams_thread
  LOAD_ATTR calls
  STORE_ATTR pending""",
        )

    def test_current_stream_requested_by_backend(self) -> None:
        def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
            torch_userstreams.current_stream("cpu", added_by="test backend")
            return gm

        self.assertExpectedInline(
            report(lambda x: x + 1, torch.ones(1), backend=backend),
            """\
1 graph(s), 0 graph break(s)
user objects of graph <lambda> [n/n]: 1
  [0] current-stream forward  SimStream    current stream of cpu  (added by test backend)
prologue, before each call:
  __userstreams_thread.calls.pending = (
      __userstreams_graph,  # the graph
      __userstreams_factory(),  # [0] current stream of cpu
  )
prologue bytecode:
  LOAD_GLOBAL __userstreams_graph
  LOAD_GLOBAL __userstreams_factory
  CALL 0
  BUILD_TUPLE 2
  LOAD_GLOBAL __userstreams_thread
  LOAD_ATTR calls
  STORE_ATTR pending""",
        )

    def test_event_requested_by_backend(self) -> None:
        def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
            torch_userstreams.new_event(device="cpu", enable_timing=True, added_by="test backend")
            return gm

        self.assertExpectedInline(
            report(lambda x: x + 1, torch.ones(1), backend=backend),
            """\
1 graph(s), 0 graph break(s)
user objects of graph <lambda> [n/n]: 1
  [0] requested      forward  SimEvent     torch.Event(device='cpu', enable_timing=True)  (added by test backend)
prologue, before each call:
  __userstreams_thread.calls.pending = (
      __userstreams_graph,  # the graph
      __userstreams_factory(),  # [0] torch.Event(device='cpu', enable_timing=True)
  )
prologue bytecode:
  LOAD_GLOBAL __userstreams_graph
  LOAD_GLOBAL __userstreams_factory
  CALL 0
  BUILD_TUPLE 2
  LOAD_GLOBAL __userstreams_thread
  LOAD_ATTR calls
  STORE_ATTR pending""",
        )

    def test_graph_with_lookup_nodes(self) -> None:
        graphs: list[str] = []

        def backend(gm: torch.fx.GraphModule, example_inputs: list) -> Any:
            graphs.append(normalized(gm.code.strip()))
            return gm

        torch.compile(makes_event, backend=backend)(torch.ones(1), SimStream(device="cpu"))
        self.assertExpectedInline(
            graphs[0],
            """\
def forward(self, L_x_ : torch.Tensor):
    l_x_ = L_x_
    lookup = torch_userstreams_run_lookup_lookup(0);  lookup = None
    lookup_1 = torch_userstreams_run_lookup_lookup(1);  lookup_1 = None
    record_event = torch.ops.streams.record_event(0, 1);  record_event = None
    add = l_x_ + 1;  l_x_ = None
    return (add,)""",
        )
