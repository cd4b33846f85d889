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


def test_the_api_reference_documents_every_public_name() -> None:
    """docs/api.md renders each name of ``__all__`` from its docstring; a name without a
    docstring would render as a bare signature."""
    text = (ROOT / "docs" / "api.md").read_text()
    documented = set(re.findall(r"^::: torch_userstreams\.(?:\w+\.)?(\w+)$", text, re.M))
    assert documented == set(torch_userstreams.__all__)
    bare = [n for n in torch_userstreams.__all__ if not getattr(torch_userstreams, n).__doc__]
    assert not bare, f"public names without a docstring: {bare}"


# The one import that goes up a layer, named in docs/internals.md.
UPWARD_IMPORTS = {("backends", "testing")}


def _layer_order() -> list[str]:
    """The layers as docs/internals.md lists them, bottom first."""
    section = (ROOT / "docs" / "internals.md").read_text().split("## Layers")[1].split("##")[0]
    order: list[str] = []
    for cell in re.findall(r"^\| (`[^|]+`) \|", section, re.M):
        order.extend(re.findall(r"`(\w+)`", cell))
    return order


def _imported_layers(path: Path, package: Path) -> set[str]:
    """The package layers (top-level modules or subpackages) that ``path`` imports."""
    import ast

    parts = path.relative_to(package).with_suffix("").parts
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = (
                list(parts[:-1])[: len(parts) - node.level] if node.level > 1 else list(parts[:-1])
            )
            target = base + (node.module.split(".") if node.module else [])
            names = target[:1] or [alias.name for alias in node.names]
            found.update(names)
    return found


def test_each_layer_imports_only_from_the_layers_below_it() -> None:
    order = _layer_order()
    assert order[:3] == ["errors", "observe", "simulator"], order
    rank = {layer: i for i, layer in enumerate(order)}
    package = ROOT / "torch_userstreams"
    upward = set()
    for path in package.rglob("*.py"):
        layer = path.relative_to(package).parts[0].removesuffix(".py")
        if layer in ("__init__", "__main__"):
            continue
        assert layer in rank, f"docs/internals.md's layer table lacks {layer}"
        for imported in _imported_layers(path, package) - {layer}:
            if imported in rank and rank[imported] > rank[layer]:
                upward.add((layer, imported))
    assert upward == UPWARD_IMPORTS


def _internals_section(title: str) -> str:
    text = (ROOT / "docs" / "internals.md").read_text()
    return text.split(f"## {title}")[1].split("\n## ")[0]


def test_the_call_walk_through_names_code_that_exists() -> None:
    """Each ``layer.module.name`` the walk-through in docs/internals.md names is there."""
    import importlib

    section = _internals_section("One call, compile to backward")
    names = set(re.findall(r"\b((?:run|compile|patch|passes|backends)\.[\w.]+\w)", section))
    assert len(names) >= 8, names
    for dotted in sorted(names):
        parts = dotted.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                found: object = importlib.import_module(
                    "torch_userstreams." + ".".join(parts[:cut])
                )
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                assert hasattr(found, attr), f"docs/internals.md names {dotted}: no {attr}"
                found = getattr(found, attr)
            break
        else:
            raise AssertionError(f"docs/internals.md names {dotted}, which is not a module")


def test_the_stage_table_names_files_that_exist() -> None:
    section = _internals_section("Where each stage of a graph's compile lives")
    paths = re.findall(r"`(\w+/[\w/]*\.py|\w+/)`", section)
    assert len(paths) >= 8, paths
    for path in paths:
        assert (ROOT / "torch_userstreams" / path).exists(), f"docs/internals.md: {path}"
