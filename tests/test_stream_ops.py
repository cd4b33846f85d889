"""The sync ops: each runs under FakeTensorMode while installed, and every user spelling of a
sync reaches the compiled graph on every supported torch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_userstreams
from torch_userstreams.fx.ops import native_op
from torch_userstreams.patch import fakes
from torch_userstreams.patch.keyword_args import PARAMETER, takes_by_name
from torch_userstreams.patch.points import minor_of
from torch_userstreams.run.own_ops import no_effect_fake, sync_op
from torch_userstreams.simulator import SimStream
from torch_userstreams.testing import capture
from torch_userstreams.testing.graph_view import Sync, read_graph

# The ops Dynamo or the package's passes put into graphs on every supported torch.
EMITTED = (
    "record_event",
    "wait_event",
    "wait_stream",
    "sync_dealloc",
    "synchronize_event",
    "synchronize_stream",
)


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("name", EMITTED)
def test_every_emitted_sync_op_runs_under_fake_tensor_mode(name: str) -> None:
    op = sync_op(name)
    with FakeTensorMode():
        assert op(*fakes.probe_args(name, torch.empty(3))) is None


@pytest.mark.usefixtures("installed")
def test_every_native_streams_op_has_a_working_fake_while_installed() -> None:
    present = {name: native_op(name) for name in fakes.PROBE_ARGS}
    present = {name: op for name, op in present.items() if op is not None}
    assert {"record_event", "wait_event", "sync_dealloc"} <= set(present)
    assert [name for name, op in present.items() if not fakes.fake_works(op, name)] == []


def test_install_supplies_fakes_only_where_native_fails_and_uninstall_restores_them() -> None:
    native_op("record_event")  # defines the ops
    from torch._library.custom_ops import OPDEFS

    names = [name for name in fakes.PROBE_ARGS if f"streams::{name}" in OPDEFS]
    opdefs = {name: OPDEFS[f"streams::{name}"] for name in names}

    def broken() -> set[str]:
        return {name for name in opdefs if not fakes.fake_works(native_op(name), name)}

    before = {name: vars(opdef)["_abstract_fn"] for name, opdef in opdefs.items()}
    broken_natively = broken()
    torch_userstreams.install()
    for name, opdef in opdefs.items():
        ours = vars(opdef)["_abstract_fn"] is no_effect_fake
        assert ours == (name in broken_natively), name
    assert broken() == set()
    torch_userstreams.uninstall()
    assert {name: vars(opdef)["_abstract_fn"] for name, opdef in opdefs.items()} == before
    assert broken() == broken_natively


def _stream_wait_stream(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
    with s1:
        y = x * 2
    s2.wait_stream(s1)
    with s2:
        return y + 1


def _stream_wait_event(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
    done = torch.Event(device="cpu")
    with s1:
        y = x * 2
    done.record(s1)
    s2.wait_event(done)
    with s2:
        return y + 1


def _stream_synchronize(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
    with s1:
        y = x * 2
    s1.synchronize()
    with s2:
        return y + 1


def _event_synchronize(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
    done = torch.Event(device="cpu")
    with s1:
        y = x * 2
    done.record(s1)
    done.synchronize()
    with s2:
        return y + 1


SPELLINGS: dict[str, tuple[Callable[..., torch.Tensor], str, Callable[[tuple], bool]]] = {
    # spelling -> (function, op, check of its args: (index of s1, index of s2) -> bool)
    "Stream.wait_stream": (_stream_wait_stream, "wait_stream", lambda a: a[0] != a[1]),
    "Stream.wait_event": (_stream_wait_event, "wait_event", lambda a: len(a) == 2),
    "Stream.synchronize": (_stream_synchronize, "synchronize_stream", lambda a: len(a) == 1),
    "Event.synchronize": (_event_synchronize, "synchronize_event", lambda a: len(a) == 1),
}


@pytest.mark.parametrize("spelling", sorted(SPELLINGS))
def test_every_user_sync_spelling_reaches_the_graph(spelling: str) -> None:
    fn, op, args_ok = SPELLINGS[spelling]
    s1, s2 = SimStream(device="cpu"), SimStream(device="cpu")
    x = torch.ones(3, requires_grad=True)
    run = capture(fn, x, s1, s2, backend="userstreams_aot_eager")
    (forward,) = run.forward
    syncs = [step for step in read_graph(forward, {}).steps if isinstance(step, Sync)]
    assert [s.args for s in syncs if s.name == op and args_ok(s.args)], forward.graph
    torch.testing.assert_close(run.result, x.detach() * 2 + 1)
    torch._dynamo.reset()
    with torch_userstreams.installed():
        out = torch.compile(fn, backend="userstreams")(x, s1, s2)
    torch.testing.assert_close(out, x.detach() * 2 + 1)


def test_the_synced_objects_are_the_calls_own() -> None:
    """The rewritten sync resolves the call's objects: the simulator logs the wait on s2."""
    s1, s2 = SimStream(device="cpu"), SimStream(device="cpu")
    with torch_userstreams.installed():
        compiled = torch.compile(_stream_wait_stream, backend="userstreams_aot_eager")
        compiled(torch.ones(2), s1, s2)
    assert ("wait_stream", s1) in s2.log


def _keyword_wait_stream(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
    with s1:
        y = x * 2
    s2.wait_stream(stream=s1)
    with s2:
        return y + 1


def _keyword_wait_event(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
    done = torch.Event(device="cpu")
    with s1:
        y = x * 2
    done.record(s1)
    s2.wait_event(event=done)
    with s2:
        return y + 1


def _keyword_record_event(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
    done = torch.Event(device="cpu")
    with s1:
        y = x * 2
    s1.record_event(event=done)
    s2.wait_event(done)
    with s2:
        return y + 1


# torch 2.11's Dynamo traces ``Stream.record_event(event)`` as a plain method call, whatever
# the spelling: the package refuses it (``compile.method_syncs``), or with a CPU event it
# fails earlier, running the method on the example event.
RECORD_EVENT_IS_A_CALL = minor_of(torch.__version__) == "2.11"
# torch 2.14's Dynamo checks the arguments of a call on a ``torch.Stream`` or a Python
# subclass of it (not a CUDA or XPU stream) against ``torch.Stream``'s own C methods (2.15
# against the class's): their waits take no keyword, so Dynamo breaks the graph at a
# keyword wait itself, and on 2.14 this test pins only that.
DYNAMO_REFUSES_KEYWORD_WAITS = minor_of(torch.__version__) == "2.14"


@pytest.mark.skipif(
    RECORD_EVENT_IS_A_CALL,
    reason="torch 2.11 traces Stream.record_event(event) as a method call in either "
    "spelling (unsupported there)",
)
def test_record_event_with_its_keyword_records_the_event_passed() -> None:
    """Dynamo's handler read only a positional event: ``record_event(event=e)`` recorded an
    event of its own and left ``e`` unrecorded, so the wait on ``e`` waited on nothing."""
    s1, s2 = SimStream(device="cpu"), SimStream(device="cpu")
    x = torch.ones(3, requires_grad=True)
    run = capture(_keyword_record_event, x, s1, s2, backend="userstreams_aot_eager")
    ((record, (event, on)), (wait, (waited, by))) = _user_syncs(run.forward[0])[:2]
    assert (record, wait, waited) == ("record_event", "wait_event", event) and on != by
    torch.testing.assert_close(run.result, x.detach() * 2 + 1)


@pytest.mark.parametrize("fn", [_keyword_wait_stream, _keyword_wait_event])
def test_waits_with_their_keyword_reach_the_graph_where_the_class_takes_it(
    fn: Callable[..., torch.Tensor],
) -> None:
    """Up to 2.13 Dynamo's handlers read ``args[0]`` and failed with an IndexError."""
    s1, s2 = SimStream(device="cpu"), SimStream(device="cpu")  # Python methods: keywords ok
    x = torch.ones(3, requires_grad=True)
    if DYNAMO_REFUSES_KEYWORD_WAITS:
        compiled = torch.compile(fn, backend="userstreams_aot_eager", fullgraph=True)
        with torch_userstreams.installed(), pytest.raises(torch._dynamo.exc.Unsupported):
            compiled(x, s1, s2)
        return
    run = capture(fn, x, s1, s2, backend="userstreams_aot_eager")
    waits = [
        args
        for name, args in _user_syncs(run.forward[0])
        if name == fn.__name__.removeprefix("_keyword_")
    ]
    assert len(waits) == 1 and len(set(waits[0])) == 2, run.forward[0].graph
    torch.testing.assert_close(run.result, x.detach() * 2 + 1)
    torch._dynamo.reset()
    with torch_userstreams.installed():
        out = torch.compile(fn, backend="userstreams")(x, s1, s2)
    torch.testing.assert_close(out, x.detach() * 2 + 1)


def _user_syncs(gm: torch.fx.GraphModule) -> list[tuple[str, tuple]]:
    return [(s.name, s.args) for s in read_graph(gm, {}).steps if isinstance(s, Sync)]


@pytest.mark.parametrize(
    ("stream_class", "keyword"),
    [(torch.Stream, "stream"), (SimStream, "other")],
    ids=["torch.Stream takes no keyword", "unknown keyword"],
)
def test_a_stream_method_called_with_keywords_eager_refuses_raises_eagers_error(
    stream_class: type, keyword: str
) -> None:
    def fn(x: torch.Tensor, s1: torch.Stream, s2: torch.Stream) -> torch.Tensor:
        s2.wait_stream(**{keyword: s1})
        return x + 1

    s1, s2 = stream_class(device="cpu"), stream_class(device="cpu")
    with pytest.raises(TypeError, match="keyword") as eager:
        fn(torch.ones(2), s1, s2)
    with torch_userstreams.installed():
        compiled = torch.compile(fn, backend="userstreams_aot_eager")
        with pytest.raises(TypeError) as raised:  # the graph breaks: eager's own error
            compiled(torch.ones(2), s1, s2)
    assert str(raised.value) == str(eager.value)


@pytest.mark.parametrize("name", sorted(PARAMETER))
def test_the_keywords_rewritten_for_torch_stream_are_those_eager_parses(name: str) -> None:
    """``torch.Stream``'s own methods have no signature to read: the package's table of the
    keywords they take must agree with eager's argument parsing."""
    stream, other = torch.Stream(device="cpu"), torch.Stream(device="cpu")
    argument = other if PARAMETER[name] == "stream" else torch.Event(device="cpu")
    try:
        getattr(stream, name)(**{PARAMETER[name]: argument})
        parses = True
    except TypeError:
        parses = False
    except RuntimeError:  # parsed, then refused: CPU events cannot record or be waited on
        parses = True
    assert takes_by_name(stream, name, PARAMETER[name]) == parses


def record_a_new_event(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    with side:
        y = x * 2
    side.record_event().wait()
    return y


def record_an_event(x: torch.Tensor, side: torch.Stream) -> torch.Tensor:
    """The spelling the error names."""
    with side:
        y = x * 2
    event = torch.Event(device="cpu")
    event.record(side)
    event.wait()
    return y


@pytest.mark.usefixtures("installed")
@pytest.mark.parametrize("backend", ["userstreams_aot_eager", "userstreams"])
def test_a_new_event_recorded_on_a_native_cpu_stream_names_the_spelling_that_works(
    backend: str,
) -> None:
    """Dynamo records a real event while tracing ``record_event()``; torch said only "cpu
    backend doesn't support events"."""
    compiled = torch.compile(record_a_new_event, backend=backend)
    with pytest.raises(Exception, match=r"stream\.record_event\(\) with no event cannot be") as exc:
        compiled(torch.ones(2), torch.Stream(device="cpu"))
    assert "event = torch.Event(device='cpu'); event.record(stream) instead" in str(exc.value)
    torch._dynamo.reset()
    got = torch.compile(record_an_event, backend=backend)(torch.ones(2), SimStream(device="cpu"))
    torch.testing.assert_close(got, torch.full((2,), 2.0))


@pytest.mark.parametrize("name", [*EMITTED, "record_stream", "synchronize_device"])
def test_the_table_of_sync_roles_matches_each_ops_schema(name: str) -> None:
    """``SYNC_ROLES`` is the one place that knows which argument of a sync is its event,
    stream, waited stream or tensor: each op's schema (native, or the package's own where
    this torch lacks it) has one argument per role, a tensor where the role is one, and an
    index where the role names a user object."""
    from torch_userstreams.fx.ops import OBJECT_ROLES, SYNC_ROLES

    op = native_op(name)
    if op is None and name not in EMITTED:
        pytest.skip(f"torch {torch.__version__} has no streams::{name}, and the package emits none")
    op = op if op is not None else sync_op(name)
    arguments = op._schema.arguments
    roles = SYNC_ROLES[name]
    assert len(arguments) == len(roles)
    for role, argument in zip(roles, arguments, strict=True):
        assert (str(argument.type) == "Tensor") == (role == "tensor"), (role, argument)
        if role in OBJECT_ROLES:
            assert argument.name.endswith("_index"), (role, argument)


def test_operands_reads_a_sync_by_role() -> None:
    from torch_userstreams.fx.ops import SyncOperands, operands

    x = torch.ones(1)
    assert operands("sync_dealloc", (3, 1, x)) == SyncOperands(event=3, stream=1, tensor=x)
    assert operands("wait_stream", (1, 2)) == SyncOperands(stream=1, waited=2)
    assert operands("record_stream", (x, 4)) == SyncOperands(stream=4, tensor=x)
    assert operands("record_event", (5,)) == SyncOperands(event=5)  # a call that left one out
    assert operands("synchronize_device", ("cuda", 0)) == SyncOperands()
