"""The README's first example runs as printed (in a process of its own: it installs)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def first_python_block() -> str:
    match = re.search(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert match is not None, "README.md has no python example"
    return match.group(1)


def test_the_first_example_prints_what_its_comment_says() -> None:
    code = first_python_block()
    (expected,) = re.findall(r"# (tensor\(.*\))$", code, re.MULTILINE)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == expected
    # The function's event, the side stream, the current stream, the pass's dealloc event.
    assert lines[1] == "1 graph(s), 0 graph break(s)", done.stdout
    assert re.fullmatch(r"user objects of graph step \[\d+/0\]: 4", lines[2]), done.stdout


def test_the_check_example_finds_the_race_it_describes() -> None:
    """The second example (``check``) runs after the first, as a reader would run them."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    code = blocks[0] + blocks[1]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    verdict = lines.index("False")
    assert lines[verdict + 1].startswith("2 stream hazard(s) (1 graph(s) checked, one run"), lines
    assert any(line.startswith("run: read-after-write: sin") for line in lines), lines
