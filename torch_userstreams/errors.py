"""Exception types: every condition a user can hit gets one of these, with the fix in the text."""

from __future__ import annotations


class UserStreamsError(RuntimeError):
    """Base class for every error raised by torch_userstreams."""


class UnsupportedTorchError(UserStreamsError):
    """The installed torch is outside the range whose internals we know."""


class PatchPointError(UserStreamsError):
    """A torch internal we patch is missing or no longer looks like we expect."""


class NotCompilingError(UserStreamsError):
    """A compile-time API was called while no graph is being compiled."""


class UserObjectError(UserStreamsError):
    """A user object cannot be registered or resolved (dead, wrong type, unknown index)."""


class UnsupportedPathError(UserStreamsError):
    """A torch.compile path that cannot honour per-call user objects."""


class StreamHazardError(UserStreamsError):
    """A graph compiled under ``TORCH_USERSTREAMS_CHECK`` has a cross-stream hazard."""


class StreamHazardWarning(UserWarning):
    """A graph compiled under ``TORCH_USERSTREAMS_CHECK=warn`` has a cross-stream hazard."""


def compiled_autograd_hint() -> str:
    """A sentence for errors met while compiled autograd is on, or "".

    Compiled autograd traces the backward again, as a graph of its own that runs none of
    the nodes' per-call bindings, so a user object the backward looks up is not there.
    """
    import sys

    module = sys.modules.get("torch._dynamo.compiled_autograd")
    active = module is not None and (
        getattr(module, "compiled_autograd_enabled", False)
        or getattr(module, "in_compiled_autograd_region", False)
    )
    if not active:
        return ""
    return (
        " Compiled autograd is on: it retraces the backward as a graph of its own, which "
        "torch_userstreams does not bind to user objects (the forward call's, or those a "
        "backward hook makes). Run the backward of stream code without compiled autograd."
    )
