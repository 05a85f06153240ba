"""``rewind_group.lua``: a consumer group whose cursor is past its stream's last id reads nothing
ever again (every new id is below the cursor).  That is where a full stream let out the way
Redis allows (its largest-id entry read, deleted, the last id lowered with ``XSETID``) leaves
the group; the script moves the cursor back so that what was never delivered is delivered once
and nothing pending is delivered again.  On the matrix (Redis 7.0, Valkey 8.1, Redis 8.2)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from airflow_provider_chasqui.core.event_follow import LAST_STREAM_ID
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.scripts import SCRIPTS

pytestmark = pytest.mark.timeout(120)
GROUP = "default"


@pytest.fixture
def r(matrix_url, queue_name: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(matrix_url.url) as client:
        yield client


def _rewind(r: redis.Redis, stream: str) -> bytes:
    script = SCRIPTS["rewind_group"]
    assert r.script_load(script.body) == script.sha
    return r.evalsha(script.sha, 1, stream, GROUP)


def _read(r: redis.Redis, stream: str, consumer: str = "c1") -> list[bytes]:
    got = r.xreadgroup(GROUP, consumer, {stream: ">"}, count=10_000)
    return [eid for _s, entries in got for eid, _f in entries]


def _cursor(r: redis.Redis, stream: str) -> bytes:
    return next(g["last-delivered-id"] for g in r.xinfo_groups(stream) if g["name"] == GROUP.encode())


def _past_the_end(r: redis.Redis, stream: str, route: str) -> bool:
    """Put the group's cursor past the stream's last id; False where ``route`` cannot.
    ``full``: a worker reads an entry at the largest id, the operator deletes it and lowers the
    last id with ``XSETID``: Redis 7.0 allows it; Redis 8.2 and Valkey refuse an id below a
    deleted one, so there the stream stays full (checked) and no cursor can be past its end
    that way.  ``setid``: a foreign ``XGROUP SETID`` ahead, on any server."""
    if route == "setid":
        r.xgroup_setid(stream, GROUP, LAST_STREAM_ID)
        return True
    r.xadd(stream, {"junk": "x"}, id=LAST_STREAM_ID)
    assert _read(r, stream, "c9") == [LAST_STREAM_ID.encode()]
    r.xack(stream, GROUP, LAST_STREAM_ID)
    r.xdel(stream, LAST_STREAM_ID)
    top = r.xrevrange(stream, count=1)
    try:
        r.execute_command("XSETID", stream, top[0][0] if top else b"1-1")
        return True
    except redis.ResponseError as exc:
        assert "max_deleted_entry_id" in str(exc), exc
    with pytest.raises(redis.ResponseError, match="exhausted the last possible ID"):
        r.xadd(stream, {"d": b"new"})
    return False


def test_a_cursor_where_it_should_be_is_left_alone(r: redis.Redis, queue_name: str) -> None:
    stream = QueueKeys.for_queue(queue_name).stream
    assert _rewind(r, stream) == b""  # no stream
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    assert _rewind(r, stream) == b""  # empty, cursor 0-0
    ids = [r.xadd(stream, {"d": b"x"}) for _ in range(5)]
    assert _read(r, stream) == ids  # delivered: the cursor at the last of them
    before = _cursor(r, stream)
    r.xadd(stream, {"d": b"y"})  # a new entry past the cursor: the normal case
    assert _rewind(r, stream) == b"" and _cursor(r, stream) == before
    r.xgroup_create(stream, "other", id="$")
    assert r.evalsha(SCRIPTS["rewind_group"].sha, 1, stream, "no-such-group") == b""


@pytest.mark.parametrize("route", ["full", "setid"])
def test_a_cursor_past_the_end_is_moved_to_the_largest_pending_id(r: redis.Redis, queue_name: str, route: str) -> None:
    """Entries delivered and still pending stay with their consumers; the new ones are delivered,
    once, to whoever reads next."""
    stream = QueueKeys.for_queue(queue_name).stream
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    held = [r.xadd(stream, {"d": b"held"}) for _ in range(3)]
    assert _read(r, stream) == held  # running, unacked
    if not _past_the_end(r, stream, route):
        return  # the stream stays full: no new entry, so no stall (checked in _past_the_end)
    new = [r.xadd(stream, {"d": b"new"}) for _ in range(4)]
    assert _read(r, stream, "c2") == []  # stalled: every new id is below the cursor
    assert _rewind(r, stream) == held[-1]
    assert _cursor(r, stream) == held[-1]
    assert _read(r, stream, "c2") == new and _read(r, stream, "c3") == []
    pending = {p["message_id"]: p["consumer"] for p in r.xpending_range(stream, GROUP, "-", "+", 100)}
    assert {k for k, v in pending.items() if v == b"c1"} == set(held)  # never handed to another consumer
    assert _rewind(r, stream) == b""  # once moved back, left alone


@pytest.mark.parametrize("route", ["full", "setid"])
def test_with_nothing_pending_the_cursor_goes_to_the_start(r: redis.Redis, queue_name: str, route: str) -> None:
    stream = QueueKeys.for_queue(queue_name).stream
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    done = [r.xadd(stream, {"d": b"done"}) for _ in range(3)]
    assert _read(r, stream) == done
    r.xack(stream, GROUP, *done)
    r.xdel(stream, *done)  # an ack deletes its entry
    if not _past_the_end(r, stream, route):
        return  # the stream stays full: no new entry, so no stall (checked in _past_the_end)
    new = [r.xadd(stream, {"d": b"new"}) for _ in range(3)]
    assert _rewind(r, stream) == b"0-0"
    assert _read(r, stream, "c2") == new


def test_pending_ids_past_the_end_are_passed_over(r: redis.Redis, queue_name: str) -> None:
    """The entry at the largest id still pending (deleted under its consumer) and more pending
    than one page: the cursor goes to the largest pending id that is not past the end.  Only
    Redis 7.0 lowers a last id below a deleted one; elsewhere the refusal is what is checked."""
    stream = QueueKeys.for_queue(queue_name).stream
    r.xgroup_create(stream, GROUP, id="0", mkstream=True)
    held = [r.xadd(stream, {"d": b"held"}) for _ in range(2_500)]
    assert _read(r, stream) == held
    r.xadd(stream, {"junk": "x"}, id=LAST_STREAM_ID)
    assert _read(r, stream, "c9") == [LAST_STREAM_ID.encode()]
    r.xdel(stream, LAST_STREAM_ID)  # deleted, not acked: pending past the end
    try:
        r.execute_command("XSETID", stream, held[-1])
    except redis.ResponseError as exc:
        assert "max_deleted_entry_id" in str(exc), exc
        return
    new = [r.xadd(stream, {"d": b"new"}) for _ in range(2)]
    assert _read(r, stream, "c2") == []
    assert _rewind(r, stream) == held[-1]
    assert _read(r, stream, "c2") == new
    assert r.xpending(stream, GROUP)["pending"] == len(held) + 1 + len(new)
