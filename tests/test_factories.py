"""The prologue's factories build the same objects as the constructor calls they stand for."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torch_userstreams.compile import factories
from torch_userstreams.simulator import SimEvent, SimStream


@pytest.mark.parametrize("cls", [SimStream, SimEvent, torch.Event])
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {"device": "cpu"}),
        (("cpu",), {}),
        ((torch.device("cpu"),), {}),
        ((), {"device": None}),
        ((), {}),
    ],
)
def test_factory_builds_what_the_call_builds(
    cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    """Also where the call fails: with no device, a CUDA build on a machine without a GPU
    asks the missing driver, and the factory must fail the same way."""
    make = factories.constructor(cls, args, kwargs)
    try:
        direct = cls(*args, **kwargs)
    except RuntimeError as exc:
        with pytest.raises(type(exc)):
            make()
        return
    built, again = make(), make()
    assert type(built) is cls and built.device == direct.device
    assert built is not again, "a fresh object per call"


def test_device_is_parsed_once_and_passed_positionally() -> None:
    make = factories.constructor(SimStream, (), {"device": "cpu", "priority": 0})
    assert make.args == (torch.device("cpu"),)  # type: ignore[attr-defined]
    assert make.keywords == {"priority": 0}  # type: ignore[attr-defined]


def test_flags_are_kept() -> None:
    make = factories.constructor(SimEvent, (), {"device": "cpu", "enable_timing": True})
    assert make.keywords == {"enable_timing": True}  # type: ignore[attr-defined]
    assert type(make()) is SimEvent
