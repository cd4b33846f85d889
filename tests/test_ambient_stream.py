"""On an accelerator Dynamo registers the ambient current stream for every frame.

We emit it only when the graph reads it: a stream-free graph gets no prologue. The machine
has no accelerator, so these tests make torch believe it has one whose current stream is a
simulated CPU stream.
"""

from __future__ import annotations

import pytest
import torch

import torch_userstreams
from torch_userstreams.simulator import SimStream
from torch_userstreams.table import EntryKind


@pytest.fixture
def fake_accelerator(monkeypatch: pytest.MonkeyPatch) -> SimStream:
    import torch._dynamo.guards
    import torch._dynamo.utils

    ambient = SimStream(device="cpu")

    def current(device: object = None) -> SimStream:
        return ambient

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_stream", current)
    # Guards and the prologue read the current stream through Dynamo's own helper (a C
    # function on newer torch that checks the real accelerator): fake it there too.
    monkeypatch.setattr(torch._dynamo.utils, "get_current_stream", current)
    monkeypatch.setattr(torch._dynamo.guards, "get_current_stream", current)
    return ambient


@pytest.mark.usefixtures("installed")
def test_stream_free_graph_pays_no_prologue_on_an_accelerator(fake_accelerator: SimStream) -> None:
    report = torch_userstreams.explain(lambda x: x + 1, torch.ones(1))
    assert report.tables == []
    assert torch.equal(report.result, torch.full((1,), 2.0))


@pytest.mark.usefixtures("installed")
def test_ambient_stream_is_loaded_when_the_graph_reads_it(fake_accelerator: SimStream) -> None:
    def record_on_current(x: torch.Tensor) -> torch.Tensor:
        done = torch.Event(device="cpu")
        done.record()  # on the ambient current stream
        return x + 1

    report = torch_userstreams.explain(record_on_current, torch.ones(1))
    (table,) = report.tables
    # torch >= 2.12 registers the ambient stream first (index 0); 2.11 when it is read.
    assert sorted((e.kind.value, e.live) for e in table.entries) == [
        (EntryKind.CURRENT_STREAM.value, True),
        (EntryKind.GRAPH_CREATED.value, True),
    ]
    assert "get_current_stream" in table.prologue_listing
