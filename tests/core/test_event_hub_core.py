"""The hub's sans-I/O decisions: which waiters an event wakes, outcomes, the reader's name."""

from __future__ import annotations

import pytest

from airflow_provider_chasqui.core.codec import encode_data
from airflow_provider_chasqui.core.event_hub import (
    Waiter,
    WaiterIndex,
    completed,
    event_hits,
    failed,
    parse_outcomes,
    reader_name,
    settle_hits,
)

pytestmark = pytest.mark.timeout(30)


def _rows(*entries: tuple[bytes, list[bytes]]) -> list:
    return [[b"{chasqui:q}:events", list(entries)]]


def test_only_ending_events_of_watched_jobs_are_hits() -> None:
    index = WaiterIndex()
    index.add(Waiter(["a", "b"]))
    rows = _rows(
        (b"1-0", [b"e", b"completed", b"id", b"a", b"ts", b"1"]),
        (b"2-0", [b"e", b"completed", b"id", b"zzz", b"ts", b"1"]),  # nobody waits for it
        (b"3-0", [b"e", b"retry-scheduled", b"id", b"b", b"ts", b"1"]),  # not an ending
        (b"4-0", [b"ts", b"1", b"reason", b"boom", b"id", b"b", b"e", b"dlq"]),  # foreign field order
        (b"5-0", []),
    )
    last, hits = event_hits(rows, index.by_job)
    assert last == "5-0"
    assert hits == {"a": ("completed", ""), "b": ("dlq", "boom")}
    assert event_hits(None, index.by_job) == (None, {})


def test_waiters_settle_once_and_stop_on_failure() -> None:
    index = WaiterIndex()
    all_of = Waiter(["a", "b"])
    stopper = Waiter(["b", "c"], stop_on_failure=True)
    index.add(all_of)
    index.add(stopper)
    assert settle_hits(index, {"a": completed(1)}) == []
    assert settle_hits(index, {"b": failed("r", "d")}) == [all_of, stopper]
    assert stopper.outcomes == {"b": failed("r", "d")} and stopper.pending == {"c"}
    assert not all_of.settle("a", completed(2))  # the first outcome wins
    assert all_of.outcomes == {"a": ("completed", 1), "b": ("failed", "r", "d", "")}  # plain tuples still compare
    assert index.pending_ids() == []  # done waiters are not re-checked
    index.remove(all_of)
    index.remove(stopper)
    index.remove(stopper)  # twice is harmless
    assert index.by_job == {} and len(index) == 0


def test_stored_records_win_over_event_hints() -> None:
    raws = [encode_data({"x": 1}), None, None, encode_data(["unrecoverable", "why", 5]), None, None, None, None]
    hints = {"c": ("completed", ""), "a": ("completed", "")}
    out = parse_outcomes(["a", "b", "c", "d"], raws, hints)
    assert out == {"a": ("completed", {"x": 1}), "b": ("failed", "unrecoverable", "why", ""), "c": ("completed", None)}
    assert parse_outcomes(["d"], [None, None], {"d": ("dlq", "boom")}) == {"d": ("failed", "boom", "", "")}
    # a record with the handler's traceback (4 elements) hands it on; a damaged one is no outcome
    tb = "Traceback (most recent call last):\n  ...\nValueError: boom"
    assert parse_outcomes(["e"], [None, encode_data(["retries_exhausted", "boom", 7, tb])]) == {
        "e": ("failed", "retries_exhausted", "boom", tb)
    }
    assert parse_outcomes(["f"], [None, b"\xc1 not msgpack"]) == {}


@pytest.mark.parametrize(
    ("queue", "name"),
    [
        ("emails", "chasqui-events:emails"),
        ("ünïcode queue", "chasqui-events:%C3%BCn%C3%AFcode%20queue"),
        ("a%b\n", "chasqui-events:a%25b%0A"),
    ],
)
def test_reader_name_is_a_valid_client_name(queue: str, name: str) -> None:
    assert reader_name(queue) == name
    assert len(reader_name("x" * 500)) == 120
