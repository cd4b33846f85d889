"""A second process with a warm Inductor cache compiles the same stream training step:
Inductor's FX graph cache serves every region, the gradients are eager's, each call syncs its
own streams, and AOTAutograd's cache is bypassed (a hit would skip the passes' requests).
The accelerator's graphs compile both as regions and as one call per graph (the default on
torch 2.12+, whose syncs are pinned by ``control_deps``, which the package marks cacheable
for its compiles). A CPU graph's one call has no sync left to pin. Keys name the package's
code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_one_call import side_then_joined

CHILD = Path(__file__).parent / "cache_child.py"
TIMEOUT_S = 300


def last_line_of(cache_dir: Path, *argv: str, hash_seed: str | None = None) -> str:
    """Run ``python *argv`` with ``cache_dir`` as Inductor's cache; its last line of output."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir)}
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = hash_seed
    done = subprocess.run(
        [sys.executable, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


def run_child(cache_dir: Path, hash_seed: str) -> dict[str, Any]:
    line = last_line_of(cache_dir, str(CHILD), hash_seed=hash_seed)
    return json.loads(line)  # type: ignore[no-any-return]


def test_a_second_process_uses_the_warm_cache_and_its_own_objects(tmp_path: Path) -> None:
    # Two hash seeds under which a set of the package's enum members pickled in two orders
    # into a one-call graph's key (its meta): the second process missed every such graph.
    first = run_child(tmp_path, hash_seed="1")
    second = run_child(tmp_path, hash_seed="2")
    for run in (first, second):
        assert run["grads_ok"] and run["objects_ok"] and run["bypass_logged"], run
        assert run["autograd_cache_hit"] == 0, run
    assert first["fxgraph_cache_miss"] > 0 and first["fxgraph_cache_hit"] == 0, first
    assert second["fxgraph_cache_hit"] == first["fxgraph_cache_miss"], second
    assert second["fxgraph_cache_miss"] == 0, second
    assert first["fxgraph_cache_bypass"] == second["fxgraph_cache_bypass"] == 0, second


NATIVE_THEN_PACKAGE = """
import sys
import torch
import torch_userstreams
from torch_userstreams.simulator import SimStream

def on_a_stream(x, s):
    with s:
        y = x * 2 + 1
    return y.sin()

def without_one(x, s):
    y = x * 2 + 1
    return y.sin()

if sys.argv[1] != "package":  # native Inductor caches stream code, fails to run it on CPU
    fn = on_a_stream if sys.argv[1] == "native" else without_one
    try:
        torch.compile(fn, backend="inductor")(torch.ones(4), SimStream(device="cpu"))
        print("native ran")
    except NameError as exc:
        print("native failed:", exc)
else:
    torch_userstreams.install()
    out = torch.compile(without_one, backend="userstreams")(torch.ones(4), SimStream(device="cpu"))
    print("package:", torch.equal(out, (torch.ones(4) * 2 + 1).sin()))
"""


def test_native_stream_code_in_the_cache_is_never_served_to_the_package(tmp_path: Path) -> None:
    """The FX graph cache keys a graph by its code, not its stream annotations: a stream-free
    graph of the package was served native Inductor's code for the same ops in a stream,
    and failed with "NameError: name 'stream1' is not defined"."""
    roles = ("native", "native, no stream", "package")
    outputs = [last_line_of(tmp_path, "-c", NATIVE_THEN_PACKAGE, role) for role in roles]
    # Native 2.11's Inductor ignores the annotation (no stream code to poison the cache);
    # later ones serve the stream code to the same ops without a stream, natively too.
    if torch.__version__ >= "2.12":
        assert outputs[:2] == ["native failed: name 'stream1' is not defined"] * 2, outputs
    assert outputs[2] == "package: True"


def test_one_call_code_cached_by_another_package_version_is_not_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package writes part of a one-call graph's code (its lookup line, its stream
    blocks): a cache a different version of the package warmed must not serve it. The
    digest of the package's modules stands in for another version's files."""
    import torch._inductor.config as inductor_config
    from torch._dynamo.utils import counters

    import torch_userstreams
    from torch_userstreams.backends import cache_tag
    from torch_userstreams.simulator import SimEvent, SimStream

    def compile_and_count() -> dict[str, int]:
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(side_then_joined, backend="userstreams")
        x, w = (torch.rand(8, requires_grad=True) for _ in range(2))
        compiled(x, w, SimStream(device="cpu"), SimEvent(device="cpu")).backward()
        return {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")}

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    with torch_userstreams.installed(), inductor_config.patch(fx_graph_cache=True):
        assert compile_and_count() == {"fxgraph_cache_miss": 2}
        assert compile_and_count() == {"fxgraph_cache_hit": 2}
        monkeypatch.setattr(cache_tag, "package_code_digest", lambda: "another version")
        assert compile_and_count() == {"fxgraph_cache_miss": 2}
    torch._dynamo.reset()
