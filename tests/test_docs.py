"""The README and docs/ as a reader meets them: every python block runs, every link to a
file of the repository leads somewhere, the README names the whole public API and stays a
guide (the rules live in docs/)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import torch_userstreams

ROOT = Path(__file__).parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *DOCS]
README_WORDS = 1200


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), re.DOTALL)


@pytest.mark.parametrize("page", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_every_python_block_of_a_docs_page_runs(page: Path) -> None:
    """Each page's blocks run in order in one fresh process, as a reader pastes them."""
    code = "\n".join(python_blocks(page))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file(page: Path) -> None:
    links = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text())
    missing = [link for link in links if not (page.parent / link).exists()]
    assert not missing, f"{page.name} links to missing files: {missing}"


def test_the_readme_names_every_public_name() -> None:
    text = (ROOT / "README.md").read_text()
    unnamed = [name for name in torch_userstreams.__all__ if f"`{name}" not in text]
    assert not unnamed, f"README.md's API table lacks {unnamed}"


def test_the_readme_is_a_guide_not_the_spec() -> None:
    words = len((ROOT / "README.md").read_text().split())
    assert words <= README_WORDS, f"README.md has {words} words: move rules to docs/"
