"""``run.lookup.lookup_all``: what a compiled call's code resolves at its start, the call's
own objects in the order asked, and for a wrong index the error ``resolve`` gives."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from torch_userstreams.errors import UserObjectError
from torch_userstreams.run.lookup import lookup_all
from torch_userstreams.run.state import state

OBJECTS = tuple(object() for _ in range(6))


@pytest.fixture
def a_call() -> Iterator[None]:
    graph = SimpleNamespace(table=SimpleNamespace(graph_name="g [0/0]", entries=[]))
    state.calls.current = (graph, *OBJECTS[:5], None)  # entry 5 was not loaded
    try:
        yield
    finally:
        state.calls.current = None


@pytest.mark.usefixtures("a_call")
def test_the_calls_objects_in_the_order_asked() -> None:
    assert lookup_all((4, 0, 2)) == (OBJECTS[4], OBJECTS[0], OBJECTS[2])
    assert lookup_all((3,)) == (OBJECTS[3],)
    assert lookup_all(()) == ()


@pytest.mark.usefixtures("a_call")
@pytest.mark.parametrize(
    ("indices", "says"),
    [
        ((0, 6), r"no user object at index 6 .*past the end of the table"),
        ((0, -1), r"no user object at index -1 .*indices start at 0"),
        ((0, "1"), r"no user object at index '1' .*an index is an int, not str"),
    ],
)
def test_a_wrong_index_is_named_with_its_graph(indices: tuple[object, ...], says: str) -> None:
    with pytest.raises(UserObjectError, match=f"graph g \\[0/0\\] has {says}"):
        lookup_all(indices)  # type: ignore[arg-type]


def test_an_entry_the_call_did_not_load_is_named(a_call: None) -> None:
    state.calls.current[0].table.entries = [None] * 5 + [  # type: ignore[index]
        SimpleNamespace(kind=SimpleNamespace(value="event"), example_type="Event", origin="x")
    ]
    with pytest.raises(UserObjectError, match=r"user object 5 of graph g \[0/0\]"):
        lookup_all((0, 5))
