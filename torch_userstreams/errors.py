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
