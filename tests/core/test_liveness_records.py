"""Heartbeat records as every viewer reads them (``core/liveness.parse_workers``): a worker's
own beat round-trips, and whatever else the identity key holds (another tool's JSON, hostile
bytes) reads as "not said", never as a wrong count or an exception."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.liveness import WORKER_COLUMNS, beat_calls, parse_workers, worker_row

NOW = 1_700_000_000_000
KEYS = QueueKeys.for_queue("q")


def _read(body: bytes | None) -> object:
    return parse_workers([("c-1", NOW + 1000)], [body], NOW)[0]


def test_a_beat_round_trips_with_its_handlers_left_running() -> None:
    record = {"kind": "worker", "host": "h", "pid": 7, "concurrency": 4, "handlers": ["a"]}
    zadd, setx = beat_calls(KEYS, "c-1", record, 30_000, NOW, True, 3)
    body = setx.args[2]
    w = _read(body.encode() if isinstance(body, str) else body)
    assert (w.left_running, w.ok, w.pid, w.concurrency, w.live) == (3, True, 7, 4, True)
    assert json.loads(body)["left_running"] == 3
    assert zadd.args[:3] == ("ZADD", KEYS.beats, NOW + 2 * 30_000)


@pytest.mark.parametrize("bad", [-1, True, False, "3", 1.5, None, [1], {"n": 1}, float("nan")])
def test_a_left_running_that_is_not_a_count_reads_as_not_said(bad: object) -> None:
    body = json.dumps({"left_running": bad, "ok": True}).encode()
    assert _read(body).left_running is None


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(),
            lambda c: st.lists(c) | st.dictionaries(st.text(), c),
            max_leaves=20,
        ).map(lambda v: json.dumps({"left_running": v}).encode()),
    )
)
def test_hostile_identity_bytes_never_raise(body: bytes) -> None:
    w = _read(body)
    assert w.left_running is None or (isinstance(w.left_running, int) and w.left_running >= 0)


def test_every_viewer_shows_the_same_cells_for_a_worker() -> None:
    """``worker_row`` is what ``chasqui workers``/``inspect`` and the dashboard print, one cell per
    column; a record missing everything shows dashes, not ``None``."""
    record = {"kind": "spark", "host": "h", "pid": 7, "version": "1.0", "handlers": ["b", "a"], "concurrency": 2}
    _zadd, setx = beat_calls(KEYS, "c-1", {**record, "started_ms": NOW - 5_000}, 30_000, NOW - 1_000, False, 2)
    w = _read(setx.args[2].encode())
    row = worker_row(w, NOW)
    assert len(row) == len(WORKER_COLUMNS)
    assert dict(zip(WORKER_COLUMNS, row)) == {
        "worker": "c-1",
        "state": "alive",
        "host": "h",
        "pid": "7",
        "version": "1.0",
        "kind": "spark",
        "handlers": "b, a",
        "concurrency": "2",
        "up": "5.0 s",
        "last beat": "1.0 s ago",
        "health": "unhealthy",
        "left running": "2",
    }
    bare = worker_row(parse_workers([("c-2", NOW - 1)], [b"junk"], NOW)[0], NOW)
    assert bare == ("c-2", "gone", *["-"] * 10)
