"""Saved-tensors hooks around a graph with accelerator streams: refused, naming them.

AOTAutograd applies the active ``torch.autograd.graph.saved_tensors_hooks`` to what the
forward saves for the backward: hooks given as traced graphs are pasted into the forward
and backward graphs after the package's passes placed their syncs, and plain functions run
on each saved tensor as the forward returns. Either way the pack hook reads tensors that a
side stream made on the current stream, with nothing ordering the two (found by the run-time
race detector: the pack's ``clone`` read ``cos`` while the side stream could still write
it), and the unpacked tensors reach the backward's side streams unsynced. On CPU streams
every op runs in program order, so nothing can race and nothing is refused; without grad
nothing is saved. A function compiled outside the hooks' block is not checked when a later
call runs inside it.
"""

from __future__ import annotations

from typing import Any

import torch

from ..compile.table import UserObjectTable, all_on_cpu
from ..errors import UnsupportedPathError


def refuse_saved_tensors_hooks(table: UserObjectTable) -> None:
    """Raise if saved-tensors hooks are active while a graph with accelerator streams
    compiles (see the module docstring)."""
    hooks = torch._C._autograd._top_saved_tensors_default_hooks(True)
    if not hooks or all_on_cpu(table) or not torch.is_grad_enabled():
        return  # without grad nothing is saved, and the hooks never run
    pack, unpack = hooks
    raise UnsupportedPathError(
        f"torch_userstreams: graph {table.graph_name} uses accelerator streams and is compiled "
        f"inside torch.autograd.graph.saved_tensors_hooks(pack={_name(pack)}, "
        f"unpack={_name(unpack)}). AOTAutograd applies those hooks to the tensors the "
        "forward saves after the package placed its syncs, so the pack hook would read "
        "tensors a side stream made with no sync (a race on a GPU), and the backward would "
        "read what it unpacked unsynced. Call the compiled function outside the "
        "saved_tensors_hooks block (enter the block around the code without streams "
        "only), or offload inside the function: copy the tensor in the stream block that "
        "made it and make the stream that reads it wait for that stream."
    )


def _name(hook: Any) -> str:
    if isinstance(hook, torch.fx.GraphModule):
        return f"a traced GraphModule ({type(hook).__name__})"
    return getattr(hook, "__qualname__", None) or repr(hook)
