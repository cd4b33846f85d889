"""``explain()`` as ``torch._dynamo.explain`` users read it: graphs and breaks first, the
tables with a legend, prologues and pass notes on request, the same as data."""

from __future__ import annotations

import json

import torch

import torch_userstreams
from torch_userstreams.simulator import SimStream


def broken(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    with side:
        y = x * 2
    print("a graph break")  # Dynamo cannot trace print
    return y + 1


def test_graphs_and_graph_breaks_come_first_with_their_reasons() -> None:
    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    logging_method = InstructionTranslatorBase.log_graph_break
    report = torch_userstreams.explain(broken, torch.ones(2), SimStream(device="cpu"))
    lines = str(report).splitlines()
    assert lines[0] == "2 graph(s), 1 graph break(s)", lines
    assert lines[1].startswith("  graph break: broken, line 17: "), lines
    assert "print" in lines[1], lines
    assert InstructionTranslatorBase.log_graph_break is logging_method, "not restored"
    torch.testing.assert_close(report.result, torch.ones(2) * 3)


def test_the_prologue_and_pass_notes_are_shown_with_verbose_only() -> None:
    def step(x: torch.Tensor, side: torch.Stream, main: torch.Stream) -> torch.Tensor:
        with side:
            y = x.sin()
        main.wait_stream(side)
        return y

    streams = SimStream(device="cpu"), SimStream(device="cpu")
    report = torch_userstreams.explain(step, torch.ones(2), *streams, backend="userstreams")
    assert "prologue" not in str(report) and "what the passes did:" not in str(report)
    assert "legend:" in str(report) and "(unused: not loaded)  no compiled code" in str(report)
    verbose = report.text(verbose=True)
    assert "prologue, before each call:\n  __userstreams_thread.calls.pending = (" in verbose
    assert "side,  # [0] L['side']" in verbose and "prologue bytecode:" not in verbose
    assert "prologue bytecode:\n  LOAD_GLOBAL" in report.text(verbose=True, bytecode=True)


def test_to_dict_is_plain_data() -> None:
    report = torch_userstreams.explain(broken, torch.ones(2), SimStream(device="cpu"))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["graphs"] == 2 and len(data["graph_breaks"]) == 1
    (table,) = [t for t in data["tables"] if t["entries"]]
    assert table["entries"][0]["kind"] == "input" and table["entries"][0]["origin"] == "L['side']"


def test_explains_on_several_threads_count_their_own_and_put_the_logging_method_back() -> None:
    import threading

    from torch._dynamo.symbolic_convert import InstructionTranslatorBase

    logging_method = InstructionTranslatorBase.log_graph_break
    counts: list[tuple[int, int]] = []

    def explain_one() -> None:
        report = torch_userstreams.explain(broken, torch.ones(2), SimStream(device="cpu"))
        counts.append((report.graphs, len(report.graph_breaks)))

    threads = [threading.Thread(target=explain_one) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counts == [(2, 1)] * 3  # each its own graphs: Dynamo's counters are process-wide
    assert InstructionTranslatorBase.log_graph_break is logging_method


def test_each_table_and_launcher_reach_the_structured_trace_tlparse_reads() -> None:
    import logging

    from torch._logging._internal import trace_log

    class Artifacts(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.payloads: dict[str, str] = {}

        def emit(self, record: logging.LogRecord) -> None:
            metadata = getattr(record, "metadata", {}).get("artifact", {})
            if isinstance(metadata, dict) and "name" in metadata:
                self.payloads[metadata["name"]] = str(getattr(record, "payload", ""))

    handler = Artifacts()
    trace_log.addHandler(handler)
    try:
        torch_userstreams.explain(
            broken, torch.ones(2), SimStream(device="cpu"), backend="userstreams_aot_eager"
        )
    finally:
        trace_log.removeHandler(handler)
    payload = handler.payloads["torch_userstreams_table"]
    assert payload.startswith("user objects of graph broken"), payload
    assert "\nprologue:\n" in payload
    launcher = handler.payloads["torch_userstreams_launcher"]  # how the graph runs
    assert launcher.startswith("def launch("), launcher


def test_userstreams_is_a_log_name_of_torchs_logging() -> None:
    """``set_logs`` knows the name and sets the package's logger; plain ``set_logs()`` puts
    the default back."""
    import logging

    assert torch._logging._internal.log_registry.is_log("userstreams")
    logger = logging.getLogger("torch_userstreams")
    # set_logs gives every registered logger torch's handler and stops its propagation:
    # put ours back as it was, for the tests that read the package's log after this one.
    saved = logger.level, logger.propagate, list(logger.handlers)
    try:
        torch._logging.set_logs(modules={"userstreams": logging.DEBUG})
        assert logger.getEffectiveLevel() == logging.DEBUG
        torch._logging.set_logs()
        assert logger.getEffectiveLevel() > logging.DEBUG
    finally:
        logger.level, logger.propagate, logger.handlers = saved


def test_torch_logs_with_the_module_name_prints_each_table() -> None:
    """What docs/troubleshooting.md tells a user to set: the table reaches stderr."""
    import os
    import subprocess
    import sys

    code = (
        "import torch, torch_userstreams\n"
        "from torch_userstreams.simulator import SimStream\n"
        "torch_userstreams.install()\n"
        "def f(x, s):\n"
        "    with s:\n"
        "        return x.sin()\n"
        "compiled = torch.compile(f, backend='userstreams_aot_eager')\n"
        "compiled(torch.ones(2), SimStream(device='cpu'))\n"
    )
    env = {**os.environ, "TORCH_LOGS": "+torch_userstreams"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "prologue:" in done.stderr and "torch_userstreams" in done.stderr


def test_the_prologue_reads_as_python_on_every_call_protocol() -> None:
    """3.10 (CALL_FUNCTION, LOAD_METHOD) and 3.11+ (PUSH_NULL, PRECALL, CALL) read alike; an
    attribute chain and a subscript keep their shape; an unloaded entry says so."""
    from torch_userstreams.compile.prologue_text import as_python

    listing = "\n".join(
        [
            "LOAD_GLOBAL __userstreams_graph",
            "LOAD_FAST self",
            "LOAD_ATTR side",
            "LOAD_GLOBAL G",
            "LOAD_CONST 'streams'",
            "BINARY_SUBSCR",
            "PUSH_NULL",
            "LOAD_GLOBAL __userstreams_factory",
            "PRECALL 0",
            "CALL 0",
            "LOAD_GLOBAL torch",
            "LOAD_METHOD Event",
            "CALL_FUNCTION 0",
            "LOAD_CONST",
            "BUILD_TUPLE 6",
            "LOAD_GLOBAL __userstreams_thread",
            "LOAD_ATTR calls",
            "STORE_ATTR pending",
        ]
    )
    names = ["[0] a", "[1] b", "[2] c", "[3] d", "[4] e (not loaded)"]
    assert as_python(listing, names) == "\n".join(
        [
            "__userstreams_thread.calls.pending = (",
            "    __userstreams_graph,  # the graph",
            "    self.side,  # [0] a",
            "    G['streams'],  # [1] b",
            "    __userstreams_factory(),  # [2] c",
            "    torch.Event(),  # [3] d",
            "    None,  # [4] e (not loaded)",
            ")",
        ]
    )


def test_a_prologue_the_reading_does_not_know_shows_its_bytecode() -> None:
    """An unknown instruction or a count that does not match the table gives None, and
    explain falls back to the listing: never a wrong rendering."""
    from torch_userstreams.compile.prologue_text import as_python

    known = "\n".join(
        ("LOAD_GLOBAL g", "LOAD_FAST s", "BUILD_TUPLE 2", "LOAD_GLOBAL t", "LOAD_ATTR calls")
    )
    known += "\nSTORE_ATTR pending"
    assert as_python(known, ["[0] s"]) is not None
    assert as_python(known, ["[0] s", "[1] t"]) is None
    assert as_python(known.replace("LOAD_FAST s", "LOAD_FAST_CHECK s"), ["[0] s"]) is None


class _Holder:
    def __init__(self) -> None:
        self.streams = {"side": SimStream(device="cpu")}


HOLDER = _Holder()


def test_a_string_constant_of_the_prologue_keeps_its_quotes() -> None:
    """(review) A stream reached through a dict key: the key is a string in the Python."""

    def step(x: torch.Tensor) -> torch.Tensor:
        with HOLDER.streams["side"]:
            return x * 2

    text = torch_userstreams.explain(step, torch.ones(2), backend="userstreams_aot_eager").text(
        verbose=True, bytecode=True
    )
    assert "LOAD_CONST 'side'" in text, text
    assert "HOLDER.streams['side'],  # [0] G['HOLDER'].streams['side']" in text, text
