"""Install/uninstall: all-or-nothing, idempotent, thread-safe, exact restore."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import torch_userstreams
from torch_userstreams.errors import PatchPointError, UnsupportedTorchError
from torch_userstreams.patch import install as patching
from torch_userstreams.patch.points import POINTS, minor_of

GOLDEN = Path(__file__).parent / "golden" / "signatures.json"
MINOR = minor_of(torch.__version__)


def snapshot() -> dict[tuple[int, str], Any]:
    """The raw value of every slot install() would write, keyed by (owner id, attribute)."""
    return {
        (id(site.owner), site.attr): vars(site.owner)[site.attr] for site, _ in patching.plan(MINOR)
    }


def test_import_patches_nothing() -> None:
    code = (
        "import torch_userstreams, torch._dynamo.graph_bytecode_inputs as g;"
        "print(g.get_external_object_by_index.__module__, torch_userstreams.is_installed())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["torch._dynamo.graph_bytecode_inputs", "False"]


def test_install_then_uninstall_restores_every_attribute_identically() -> None:
    before = snapshot()
    torch_userstreams.install()
    writes = patching.applied_sites()
    assert len(writes) > len(POINTS[MINOR]), "expected by-value aliases to be found too"
    assert {(id(site.owner), site.attr) for site, _ in writes} == before.keys()
    for site, new in writes:
        assert vars(site.owner)[site.attr] is new, site.where
        assert vars(site.owner)[site.attr] is not before[(id(site.owner), site.attr)]
    torch_userstreams.uninstall()
    after = {(id(site.owner), site.attr): vars(site.owner)[site.attr] for site, _ in writes}
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert after[key] is value, key


def test_every_patched_handler_table_entry_is_in_the_installed_table() -> None:
    """Several points may patch one class's handler table (Dynamo's ``tp_methods``, torch
    2.14+): the table is written once, holding every patched entry."""
    writes = patching.plan(MINOR)
    slots = [(id(site.owner), site.attr) for site, _ in writes]
    assert len(slots) == len(set(slots)), "a slot is written twice: the last write wins"
    torch_userstreams.install()
    try:
        for site, new in patching.applied_sites():
            table = site.point.table
            if table is not None and site.attr == site.point.qualname.split(".")[-1]:
                entry = vars(site.owner)[table][site.attr]
                assert entry.handler is new, site.where
    finally:
        torch_userstreams.uninstall()


def test_every_alias_of_a_native_function_is_patched() -> None:
    natives = {
        site.point.name: site.original for site, _ in patching.plan(MINOR) if site.point.aliases
    }
    torch_userstreams.install()
    for name, native in natives.items():
        assert patching.find_aliases(native) == [], f"{name} still reachable natively"


def test_known_aliases_are_found() -> None:
    where = {site.where for site, _ in patching.plan(MINOR)}
    for expected in (
        "torch._dynamo.variables.builder.get_external_object_by_index",
        "torch._dynamo.variables.streams.get_external_object_by_index",
        "torch._dynamo.variables.user_defined.get_external_object_by_index",
        "torch._functorch._aot_autograd.streams.new_event",
        "torch._functorch._aot_autograd.streams.get_current_stream",
        "torch._dynamo.output_graph.has_user_objects",
        "torch._dynamo.convert_frame.reset_user_object_tracking",
    ):
        assert expected in where


def test_install_is_idempotent() -> None:
    before = snapshot()
    torch_userstreams.install()
    first = patching.applied_sites()
    torch_userstreams.install()
    assert len(patching.applied_sites()) == len(first)
    torch_userstreams.uninstall()
    assert not torch_userstreams.is_installed()
    assert all(snapshot()[key] is value for key, value in before.items())


def test_install_is_thread_safe() -> None:
    # Planned before installing: once installed, the plan's alias scan would also count the
    # code Inductor generated while installed, which imports the package's lookup itself.
    expected = len(patching.plan(MINOR))
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        torch_userstreams.install()

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(patching.applied_sites()) == expected


def test_installed_context_manager_restores() -> None:
    before = snapshot()
    with torch_userstreams.installed():
        assert torch_userstreams.is_installed()
    assert not torch_userstreams.is_installed()
    assert all(snapshot()[key] is value for key, value in before.items())


def test_installed_blocks_overlapping_across_threads_keep_the_package_installed() -> None:
    """A block that ended while another thread's block was still open uninstalled the
    package under it (``explain()`` and ``testing.capture()`` open such blocks)."""
    assert not torch_userstreams.is_installed()
    first_inside, second_inside, first_left = (threading.Event() for _ in range(3))
    seen: list[bool] = []

    def first() -> None:
        with torch_userstreams.installed():
            first_inside.set()
            second_inside.wait(30)
        first_left.set()

    def second() -> None:
        first_inside.wait(30)
        with torch_userstreams.installed():
            second_inside.set()
            first_left.wait(30)
            seen.append(torch_userstreams.is_installed())

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == [True]
    assert not torch_userstreams.is_installed(), "the last block out uninstalls"


@pytest.mark.parametrize("version", ["2.10.0", "2.16.0", "2.13.0.dev20260101+cpu", "3.0.0"])
def test_unsupported_version_raises_and_patches_nothing(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    before = snapshot()
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(UnsupportedTorchError) as info:
        torch_userstreams.install()
    message = str(info.value)
    assert version in message and ">=2.11,<2.16" in message and "Nothing was patched" in message
    assert not torch_userstreams.is_installed()
    assert all(snapshot()[key] is value for key, value in before.items())


def test_missing_patch_point_raises_and_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo.variables.streams as streams

    before = snapshot()
    monkeypatch.delattr(streams, "new_stream")
    with pytest.raises(PatchPointError) as info:
        torch_userstreams.install()
    message = str(info.value)
    assert "torch._dynamo.variables.streams.new_stream" in message
    assert torch.__version__ in message and "Nothing was patched" in message
    assert not torch_userstreams.is_installed()
    monkeypatch.undo()
    assert all(snapshot()[key] is value for key, value in before.items())


def test_every_wrapping_replacement_carries_the_native_it_wraps() -> None:
    """A ``wraps`` point's factory returns a function marked with the native it calls (the
    one mark, ``originals.carries``): each patched slot leads back to its own original."""
    from torch_userstreams.originals import original_of

    def function(value: Any) -> Any:
        return value.__func__ if isinstance(value, staticmethod) else value

    wrapping = [
        (site, new)
        for site, new in patching.plan(MINOR)
        # a point's handler-table copy (torch 2.14+'s tp_methods) is a dict, not a replacement
        if site.point.wraps and site.attr != site.point.table
    ]
    assert wrapping, "no point of this torch wraps its native"
    for site, new in wrapping:
        assert original_of(function(new)) is function(site.original), site.where


def test_a_factory_whose_replacement_carries_nothing_fails_the_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dataclasses import replace

    from torch_userstreams.patch import install as install_module

    before = snapshot()
    points = list(POINTS[MINOR])
    at = next(i for i, point in enumerate(points) if point.wraps)
    points[at] = replace(points[at], replacement=lambda native: lambda *a, **k: native(*a, **k))
    monkeypatch.setitem(install_module.POINTS, MINOR, points)
    with pytest.raises(PatchPointError) as info:
        torch_userstreams.install()
    message = str(info.value)
    assert points[at].name in message and "Nothing was patched" in message
    assert "originals.carries(native)" in message
    assert not torch_userstreams.is_installed()
    monkeypatch.undo()
    assert all(snapshot()[key] is value for key, value in before.items())


def test_changed_signature_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch._dynamo.graph_bytecode_inputs as gbi

    monkeypatch.setattr(gbi, "register_user_object", lambda value, source, extra: 0)
    with pytest.raises(PatchPointError, match=r"register_user_object.*parameters"):
        torch_userstreams.install()
    assert not torch_userstreams.is_installed()


def test_failure_half_way_through_writing_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    before = snapshot()
    real_plan = patching.plan

    class Frozen:
        def __setattr__(self, name: str, value: Any) -> None:
            raise AttributeError("read-only")

    frozen = Frozen()
    vars(frozen)["slot"] = None  # bypass __setattr__ for the initial value

    def plan_with_a_read_only_slot(minor: str) -> list[Any]:
        writes = real_plan(minor)
        site = patching.Site(frozen, "slot", None, writes[0][0].point)
        return [*writes, (site, object())]

    monkeypatch.setattr(patching, "plan", plan_with_a_read_only_slot)
    with pytest.raises(AttributeError):
        torch_userstreams.install()
    assert not torch_userstreams.is_installed()
    monkeypatch.undo()
    assert all(snapshot()[key] is value for key, value in before.items())


def current_signatures() -> dict[str, str]:
    import inspect

    return {
        point.name: str(inspect.signature(patching.resolve(point).native))
        for point in POINTS[MINOR]
    }


def test_golden_signatures_of_patched_internals() -> None:
    """When upstream changes a patched internal, this is the one test that fails."""
    golden = json.loads(GOLDEN.read_text())
    assert MINOR in golden, f"no golden signatures for torch {MINOR}: add them (CONTRIBUTING.md)"
    assert current_signatures() == golden[MINOR]
