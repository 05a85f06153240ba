"""``EventCursor`` (core/event_follow.py): every events follower's position, start, reads and
trim check, fed real and hostile replies (no Redis: the replies are what Redis could send)."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_chasqui.core.event_follow import EventCursor, is_stream_id, stream_id
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.errors import ConfigError

pytestmark = pytest.mark.timeout(30)

KEYS = QueueKeys.for_queue("follow-q")
STREAM = KEYS.events.encode()


def _reply(*entries: Any) -> list[Any]:
    return [[STREAM, list(entries)]]


def _cursor(position: str = "5-0", **kw: Any) -> EventCursor:
    return EventCursor(KEYS, position, **kw)


def test_pin_starts_after_the_last_entry_or_at_the_start() -> None:
    c = _cursor("$")
    assert not c.pinned
    assert c.pin_call().args == ("XREVRANGE", KEYS.events, "+", "-", "COUNT", 1)
    assert c.pin([[b"17-3", [b"e", b"completed"]]]) == "17-3" == c.position and c.pinned
    for hostile in ([], None, ValueError("WRONGTYPE"), b"OK", 3, [[]], [[b"not-an-id", []]], [b"17-3"]):
        c = _cursor("$")
        assert c.pin(hostile) == "0-0", hostile  # nothing known in the stream: read it from its start


def test_read_call_follows_the_position_and_is_built_once_per_position() -> None:
    c = _cursor("5-0", count=1000, block_ms=10_000)
    first = c.read_call()
    assert first.args == ("XREAD", "COUNT", 1000, "BLOCK", 10_000, "STREAMS", KEYS.events, "5-0")
    assert c.read_call() is first  # the hub's loop re-sends it without rebuilding
    list(c.consume(_reply((b"6-0", [b"e", b"waiting"]))))
    assert c.read_call().args[-1] == "6-0"
    assert c.read_call(7, None).args == ("XREAD", "COUNT", 7, "STREAMS", KEYS.events, "6-0")
    assert c.read_call(block_ms=0).args == ("XREAD", "COUNT", 1000, "BLOCK", 0, "STREAMS", KEYS.events, "6-0")
    c.block_ms = None
    assert "BLOCK" not in c.read_call().args  # a changed setting is not served from the cache
    c.count = 3
    assert c.read_call().args[2] == 3


def test_consume_hands_out_entries_and_moves_the_position_as_it_goes() -> None:
    c = _cursor("5-0")
    reply = _reply((b"6-0", [b"e", b"completed", b"id", b"a"]), (b"7-1", [b"e", b"dlq"]), (b"8-0", []))
    it = c.consume(reply)
    assert next(it) == ("6-0", [b"e", b"completed", b"id", b"a"]) and c.position == "6-0"
    it.close()  # a follower that stops here reads 7-1 again, not past it
    assert c.position == "6-0"
    assert list(c.consume(reply))[1:] == [("7-1", [b"e", b"dlq"]), ("8-0", [])]
    assert c.position == "8-0"


@pytest.mark.parametrize(
    "reply",
    [None, [], ValueError("WRONGTYPE Operation against a key"), b"OK", 0, {STREAM: []}, [[STREAM]], [[STREAM, None]]],
)
def test_a_reply_that_is_not_entries_moves_nothing(reply: Any) -> None:
    c = _cursor("5-0")
    assert list(c.consume(reply)) == []
    assert c.hits(reply, {b"a": 1}) == {}
    assert c.position == "5-0"


def test_malformed_entries_are_skipped_and_odd_field_lists_survive() -> None:
    c = _cursor("5-0")
    reply = [
        b"garbage row",
        [STREAM, [(b"6-0", [b"e"]), (b"not-an-id", [b"e", b"x"]), (None, []), b"7-0", (b"8-0",), (b"9-0", None)]],
        [STREAM, [(b"10-0", [b"e", b"completed", b"id"]), (b"11-0", b"raw bytes")]],
    ]
    assert list(c.consume(reply)) == [
        ("6-0", [b"e"]),
        ("9-0", []),
        ("10-0", [b"e", b"completed", b"id"]),
        ("11-0", []),
    ]
    assert c.position == "11-0"


def test_hits_finds_ending_events_and_moves_past_the_reply() -> None:
    by_job = {b"a": 1, b"b": 1}
    c = _cursor("5-0")
    reply = _reply(
        (b"6-0", [b"e", b"completed", b"id", b"a"]),
        (b"7-0", [b"e", b"dlq", b"id", b"b", b"reason", b"boom", b"odd"]),  # an odd field list
        (b"8-0", [b"e"]),
        (b"9-0", []),
    )
    assert c.hits(reply, by_job) == {"a": ("completed", ""), "b": ("dlq", "boom")}
    assert c.position == "9-0"
    # a malformed entry among them: the well-formed ones still count
    c = _cursor("5-0")
    hostile = _reply((b"6-0", [b"e", b"completed", b"id", b"a"]), b"junk", (b"7-0", 5), (b"8-0", []), (None, []))
    assert c.hits(hostile, by_job) == {"a": ("completed", "")}
    assert c.position == "8-0"
    # an entry id that is not a stream id never becomes the position
    c = _cursor("5-0")
    assert c.hits(_reply((b"zz", [b"e", b"completed", b"id", b"b"])), by_job) == {"b": ("completed", "")}
    assert c.position == "5-0"


@pytest.mark.parametrize("position", ["", "latest", "5-", "-1", "5-0-0", " 5-0", "5-0\n", "+", "0x10"])
def test_a_position_that_is_not_a_stream_id_is_refused(position: str) -> None:
    with pytest.raises(ConfigError, match="stream id"):
        EventCursor(KEYS, position)
    c = _cursor("5-0")
    with pytest.raises(ConfigError):
        c.seek(position)
    assert c.position == "5-0"


def test_stream_ids() -> None:
    for ok in ("0", "0-0", "1700000000000-12", b"5-1"):
        assert is_stream_id(ok), ok
    for bad in (None, 5, [], "$", "a-b", "5--1", "\u0663-0", b"1-0\n"):
        assert not is_stream_id(bad), bad
    assert stream_id("7") == (7, 0) and stream_id("7-2") > stream_id("7-1") > stream_id("6-99")
    c = _cursor("0")  # an incomplete id (as XREAD takes it) is a position
    c.seek("$")
    assert not c.pinned


def _info(*, deleted: Any = b"0-0", added: Any = 9, length: Any = 9, first: Any = None, last: Any = b"99-0") -> list:
    """An XINFO STREAM reply (Redis 7 fields, flat as RESP2 sends it)."""
    return [
        b"length", length, b"radix-tree-keys", 1, b"last-generated-id", last,
        b"max-deleted-entry-id", deleted, b"entries-added", added, b"first-entry", first,
    ]  # fmt: skip


def test_trimmed_tells_whether_entries_after_the_position_are_gone() -> None:
    c = _cursor("10-0")
    assert c.trim_call().args == ("XINFO", "STREAM", KEYS.events)
    # deleted (XDEL): the marker says up to where
    assert c.trimmed(_info(deleted=b"12-3", added=9, length=8)) == "(10-0, 12-3]"
    assert c.trimmed(_info(deleted=b"10-0", added=9, length=8, first=[b"3-0", []])) is None
    # trimmed (MAXLEN/XTRIM leaves the marker at 0-0): the oldest entry left is past the position
    assert c.trimmed(_info(added=9, length=2, first=[b"15-0", [b"e", b"x"]])) == "(10-0, 15-0)"
    assert c.trimmed(_info(added=9, length=2, first=[b"9-0", []])) is None  # the position is still there
    assert c.trimmed(_info(added=9, length=9, first=[b"15-0", []])) is None  # nothing ever removed
    assert c.trimmed(_info(added=9, length=0, last=b"20-0")) == "(10-0, 20-0]"  # every entry removed
    assert c.trimmed(_info(added=9, length=0, last=b"10-0")) is None  # ... after it had read them all
    assert _cursor("10").trimmed(_info(deleted=b"10-1")) == "(10, 10-1]"
    hostile = [None, ValueError("ERR no such key"), b"OK", [], [b"odd"], _info(deleted=None, added=b"9")]
    hostile += [_info(deleted=b"junk", length=2, first=[b"junk", []]), _info(length=None, first=[b"15-0"])]
    for reply in hostile:
        assert c.trimmed(reply) is None, reply
    assert _cursor("$").trimmed(_info(deleted=b"12-3")) is None  # not pinned: nothing read could be lost


LAST = "18446744073709551615-18446744073709551615"


@pytest.mark.parametrize("read", ["consume", "hits"])
def test_at_the_largest_id_the_cursor_reads_on_once_the_stream_moved_on(read: str) -> None:
    """An entry at the largest id (any writer may add it) leaves the position where nothing can
    follow: ``stuck``, reads wait at most ``STUCK_POLL_MS``, and ``unstick`` moves back to the
    entry before it once the stream's last id is another (made again, or lowered)."""
    from airflow_provider_chasqui.core.event_follow import LAST_STREAM_ID, STUCK_POLL_MS

    assert LAST == LAST_STREAM_ID
    c = _cursor("5-0", count=10, block_ms=10_000)
    reply = _reply([b"6-0", [b"e", b"completed", b"id", b"a"]], [LAST.encode(), [b"e", b"completed", b"id", b"x"]])
    if read == "consume":
        assert [eid for eid, _f in c.consume(reply)] == ["6-0", LAST]
    else:
        assert set(c.hits(reply, {b"a": None, b"x": None})) == {"a", "x"}
    assert c.position == LAST and c.stuck
    assert c.read_call().args[:5] == ("XREAD", "COUNT", 10, "BLOCK", STUCK_POLL_MS)
    assert c.end_call().script is not None and c.end_call().script.name == "stream_last_id"
    assert c.end_call().keys == (KEYS.events,)
    assert not c.unstick(LAST.encode()) and c.stuck  # still full: stay
    assert c.unstick(b"") and c.position == "6-0" and not c.stuck  # deleted: read on after 6-0
    assert c.read_call().args[:5] == ("XREAD", "COUNT", 10, "BLOCK", 10_000)
    assert not c.unstick(b"")  # not stuck: nothing to do


def test_a_cursor_that_starts_at_the_largest_id_reads_a_new_stream_from_its_start() -> None:
    for start in (LAST, "$"):
        c = _cursor(start)
        if start == "$":
            c.pin([[LAST.encode(), [b"e", b"x"]]])
        assert c.stuck
        assert c.unstick(b"1700000000000-0") and c.position == "0-0"
    c = _cursor("7-0")
    assert list(c.consume(_reply([LAST.encode(), []]))) == [(LAST, [])]
    assert list(c.consume(_reply([LAST.encode(), []]))) == [(LAST, [])]  # read again: still 7-0 before it
    assert c.unstick(b"8-0") and c.position == "7-0"
