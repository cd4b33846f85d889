"""``python -m torch_userstreams.demo``: train a small side-stream model, compiled vs eager.

Each block of the model runs one branch on a stream it creates in its own ``forward`` and
joins it back with events, the pattern the package exists for. The demo trains it with
``torch.compile(backend="userstreams")`` and checks the result against an identical eager
run: loss and gradient parity, speed, compile time, live stream/event objects and the
user-object table of every compiled graph. ``--compare-native`` adds native
``torch.compile`` streams support side by side; ``--timeline`` draws one step per stream,
``--trace`` writes it as a Chrome trace for Perfetto.
"""

from __future__ import annotations

from .cli import main

__all__ = ["main"]
