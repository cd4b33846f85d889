"""Shared fixtures: a clean Dynamo and a known install state around every test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import torch_userstreams


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch_userstreams.uninstall()
    torch._dynamo.reset()


@pytest.fixture
def installed() -> Iterator[None]:
    torch_userstreams.install()
    yield
    torch_userstreams.uninstall()
