"""The demo's progress bar: in place on a terminal, one line in a log; its rate leaves out
the first step, which compiles (the bar said 4.2 step/s where the summary said 2,809.9)."""

from __future__ import annotations

import io

from torch_userstreams.demo.progress import ProgressBar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_one_line_and_no_carriage_return() -> None:
    log = io.StringIO()
    bar = ProgressBar("userstreams", 3, stream=log, first_note="compiling")
    for done in (1, 2, 3):
        bar.update(done)
    bar.close()
    text = log.getvalue()
    assert "\r" not in text
    assert text.count("\n") == 1, text
    assert text.startswith("userstreams            [" + "#" * 30 + "] 3/3 "), text
    assert "step/s after the first (first step " in text, text


def test_the_rate_counts_the_steps_after_the_first() -> None:
    bar = ProgressBar("x", 11, stream=io.StringIO())
    bar.start = 0.0
    bar.update(1)
    bar.first_end = 10.0  # a first step that compiled for 10 s
    assert bar.line(11, now=12.0).endswith("5.0 step/s after the first (first step 10.0 s)")


def test_a_terminal_says_compiling_until_the_first_step_ends() -> None:
    terminal = Terminal()
    bar = ProgressBar("userstreams", 2, stream=terminal, first_note="compiling")
    assert terminal.getvalue().startswith("\ruserstreams")
    assert "(compiling)" in terminal.getvalue()
    bar.update(1)
    assert "first step" in terminal.getvalue().rsplit("\r", 1)[-1]
    bar.close()
    assert terminal.getvalue().endswith("\n")


def test_disabled_writes_nothing() -> None:
    out = Terminal()
    bar = ProgressBar("x", 2, stream=out, enabled=False)
    bar.update(1)
    bar.close()
    assert out.getvalue() == ""
