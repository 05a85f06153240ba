"""DLQ tools survive corrupt data: replay pages past undecodable entries (and says how many it
skipped), ``dlq remove`` / ``dlq purge`` delete exactly what they name, after confirmation.

Every DLQ here starts with hostile entries at its head: payloads that are not msgpack, msgpack
that is not an envelope, a missing ``d`` field, invalid UTF-8 names and reasons."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import msgpack
import pytest
import redis

from airflow_provider_chasqui import Queue, SyncQueue
from airflow_provider_chasqui.core.dlq import DLQ_PAGE
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.errors import ConfigError

HOSTILE_PAYLOADS = [
    b"\xc1",
    b"\xff" * 64,
    msgpack.packb({"not": "an envelope"}),
    msgpack.packb([1, 2]),
    b"",
    msgpack.packb(["id", b"\x00", "not-a-time", 0]),
    b"\x92\x01",
]


def chasqui(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
        env=dict(os.environ),
    )


def _envelope(job_id: str, data: object, attempt: int = 3) -> bytes:
    return msgpack.packb([job_id, msgpack.packb(data), 1700000000000, attempt])


def _seed(url: str, queue: str, *, bad: int, good: int, good_name: bytes = b"boom") -> tuple[list[bytes], list[bytes]]:
    """``bad`` hostile entries at the head, then ``good`` decodable ones: ``(bad ids, good ids)``."""
    k = QueueKeys.for_queue(queue)
    r = redis.Redis.from_url(url)
    pipe = r.pipeline(transaction=False)
    for i in range(bad):
        fields = {"source_id": f"{i}-0", "reason": "malformed" if i % 2 else b"\xfe\xff decode", "n": b"\xff\x00"}
        if i % 5:
            fields["d"] = HOSTILE_PAYLOADS[i % len(HOSTILE_PAYLOADS)]
        pipe.xadd(k.dlq, fields)
    for i in range(good):
        pipe.xadd(
            k.dlq,
            {"d": _envelope(f"G{i}", {"i": i}), "n": good_name, "source_id": f"9-{i}", "reason": "retries_exhausted"},
        )
    ids = pipe.execute()
    r.close()
    return ids[:bad], ids[bad:]


def test_replay_pages_past_a_head_of_undecodable_entries(redis_url: str, queue_name: str) -> None:
    """Regression: 2 pages of corrupt entries at the head used to make every replay a no-op."""
    bad_ids, good_ids = _seed(redis_url, queue_name, bad=2 * DLQ_PAGE + 7, good=30, good_name=b"n\xffame")
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        assert q.replay_dlq(10) == 10  # the compatible API: still an int
        report = q.replay_dlq_report(1000)
        assert report == {"replayed": 20, "skipped": len(bad_ids)}
        assert q.replay_dlq_report(5) == {"replayed": 0, "skipped": len(bad_ids)}
    r = redis.Redis.from_url(redis_url)
    k = QueueKeys.for_queue(queue_name)
    assert [e[0] for e in r.xrange(k.dlq)] == bad_ids  # the corrupt entries all stay
    stream = r.xrange(k.stream)
    assert sorted(msgpack.unpackb(f[b"d"])[0] for _, f in stream) == sorted(f"G{i}" for i in range(30))
    assert {f[b"n"] for _, f in stream} == {b"n\xffame"}  # the name is replayed byte for byte
    assert {msgpack.unpackb(f[b"d"])[3] for _, f in stream} == {0}  # attempt reset


def test_replay_limit_is_exact_across_pages(redis_url: str, queue_name: str) -> None:
    _seed(redis_url, queue_name, bad=3, good=DLQ_PAGE + 50)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        assert q.replay_dlq_report(DLQ_PAGE + 1) == {"replayed": DLQ_PAGE + 1, "skipped": 3}
        assert q.replay_dlq_report(DLQ_PAGE) == {"replayed": 49, "skipped": 3}
        with pytest.raises(ConfigError):
            q.replay_dlq_report(0)


async def test_async_queue_has_the_same_dlq_tools(redis_url: str, queue_name: str) -> None:
    bad_ids, good_ids = _seed(redis_url, queue_name, bad=4, good=3)
    q = Queue(queue_name, redis_url=redis_url)
    try:
        assert await q.remove_dlq([bad_ids[0].decode(), "1-1"]) == 1
        assert await q.replay_dlq_report(2) == {"replayed": 2, "skipped": 3}
        assert await q.purge_dlq(reason="malformed") == 2
        assert await q.purge_dlq() == 2
        assert await q.peek_dlq() == []
    finally:
        await q.close()


def test_remove_and_purge_through_the_api(redis_url: str, queue_name: str) -> None:
    bad_ids, good_ids = _seed(redis_url, queue_name, bad=DLQ_PAGE + 20, good=5)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        for bad in (["not-an-id"], ["1-0", "1-0; FLUSHALL"], [b"1-0"], ["-1-0"]):
            with pytest.raises(ConfigError, match="DLQ ids"):
                q.remove_dlq(bad)
        assert q.remove_dlq([]) == 0
        assert q.remove_dlq([bad_ids[0].decode(), good_ids[0].decode(), "1-1"]) == 2
        undecodable_reason = sum(1 for i in range(1, DLQ_PAGE + 20) if not i % 2)
        assert q.purge_dlq(reason="\ufffd\ufffd decode") == undecodable_reason  # invalid UTF-8, as peek shows it
        assert q.purge_dlq(name="boom", reason="malformed") == 0
        assert q.purge_dlq(name="boom") == 4
        left = q.peek_dlq(DLQ_PAGE * 2)
        assert {e["reason"] for e in left} == {"malformed"} and len(left) == DLQ_PAGE + 20 - 1 - undecodable_reason
        with pytest.raises(ConfigError):
            q.purge_dlq(reason=b"malformed")  # type: ignore[arg-type]
        assert q.purge_dlq() == len(left)
        assert q.purge_dlq() == 0


def test_purge_keeps_entries_dead_lettered_after_it_started(redis_url: str, queue_name: str) -> None:
    """Purging everything deletes up to the newest entry it saw (XTRIM MINID below it, then
    XDEL of it), not the key."""
    _seed(redis_url, queue_name, bad=3, good=2)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        flow = q._flows.purge_dlq()
        step = next(flow)  # stream_ends.lua: the ids that fix the boundary
        reply = q.driver.call(step)
        r = redis.Redis.from_url(redis_url)
        late = r.xadd(q.keys.dlq, {"d": _envelope("LATE", 1), "n": "late", "reason": "retries_exhausted"})
        trim = flow.send(reply)
        assert isinstance(trim, list)  # the trim and the delete, in one round trip
        with pytest.raises(StopIteration) as done:
            flow.send(q.driver.pipeline(trim))
        assert done.value.value == 5
        assert [e[0] for e in r.xrange(q.keys.dlq)] == [late]
        # filtered: entries matching the filter that arrive while it runs stay too
        _seed(redis_url, queue_name, bad=0, good=DLQ_PAGE + 10)
        flow = q._flows.purge_dlq(reason="retries_exhausted")
        step = next(flow)
        reply = q.driver.call(step)
        later = r.xadd(q.keys.dlq, {"d": _envelope("LATER", 1), "n": "late", "reason": "retries_exhausted"})
        try:
            while True:
                step = flow.send(reply)
                reply = q.driver.call(step)
        except StopIteration as finished:
            assert finished.value == DLQ_PAGE + 11  # the seeded ones and `late`, not `later`
        assert [e[0] for e in r.xrange(q.keys.dlq)] == [later]
        r.close()


def test_cli_remove_purge_and_replay_report(redis_url: str, queue_name: str) -> None:
    bad_ids, good_ids = _seed(redis_url, queue_name, bad=DLQ_PAGE + 3, good=4)
    url = ["--redis-url", redis_url]
    replay = json.loads(chasqui("dlq", "replay", queue_name, "--limit", "2", "--yes", "--json", *url).stdout)
    assert replay == {"replayed": 2, "limit": 2, "skipped": DLQ_PAGE + 3}
    human = chasqui("dlq", "replay", queue_name, "--limit", "10", "--yes", *url).stdout
    assert f"replayed 2 of 10 entries\nskipped {DLQ_PAGE + 3} undecodable entries" in human

    for cmd in (["remove", queue_name, bad_ids[0].decode()], ["purge", queue_name]):
        refused = chasqui("dlq", *cmd, *url, stdin="")  # no terminal, no --yes
        assert refused.returncode == 2 and "--yes" in refused.stderr, refused.stderr
    assert len(SyncQueue(queue_name, redis_url=redis_url).peek_dlq(DLQ_PAGE * 2)) == DLQ_PAGE + 3

    gone = chasqui("dlq", "remove", queue_name, bad_ids[0].decode(), bad_ids[1].decode(), "--yes", "--json", *url)
    assert gone.returncode == 0 and json.loads(gone.stdout) == {"removed": 2, "asked": 2}
    again = chasqui("dlq", "remove", queue_name, bad_ids[0].decode(), "--yes", *url)
    assert again.returncode == 4 and "not in the DLQ" in again.stderr
    bad = chasqui("dlq", "remove", queue_name, "x; DEL", "--yes", *url)
    assert bad.returncode == 2 and "DLQ ids" in bad.stderr

    some = chasqui("dlq", "purge", queue_name, "--reason", "malformed", "--yes", "--json", *url)
    odd = sum(1 for i in range(2, DLQ_PAGE + 3) if i % 2)
    assert some.returncode == 0 and json.loads(some.stdout) == {"purged": odd}, some.stderr
    rest = chasqui("dlq", "purge", queue_name, "--yes", *url)
    assert rest.returncode == 0 and rest.stdout == f"purged {DLQ_PAGE + 1 - odd} entries\n"
    assert SyncQueue(queue_name, redis_url=redis_url).peek_dlq() == []


@pytest.mark.timeout(120)
def test_peek_shows_the_job_id_and_the_handlers_error(redis_url: str, queue_name: str) -> None:
    """A failed task is matched to its DLQ row: ``dlq peek --json`` shows the job id (from the
    envelope) and the handler's error (from the failure record a result-storing worker keeps);
    a hostile entry has neither, and a damaged failure record shows as no error, not a crash."""
    import asyncio

    from airflow_provider_chasqui import UnrecoverableError, Worker

    def boom(job) -> None:
        raise UnrecoverableError(f"no such account {job.data['account']}")

    async def run() -> tuple[str, str]:
        async with Queue(queue_name, redis_url=redis_url) as q:
            failing = await q.add("boom", {"account": 4711})
            damaged = await q.add("boom", {"account": 1})
            worker = Worker(queue_name, {"boom": boom}, redis_url=redis_url, store_results=True, read_block_ms=200)
            task = asyncio.create_task(worker.run())
            for _ in range(600):
                if len(await q.peek_dlq()) == 2:
                    break
                await asyncio.sleep(0.05)
            await worker.close()
            await task
            return failing.id, damaged.id

    failing_id, damaged_id = asyncio.run(run())
    k = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r:
        r.set(k.failure(damaged_id), b"\xc1 not msgpack")
        r.xadd(k.dlq, {"d": b"\xc1", "reason": "malformed"})
    out = chasqui("dlq", "peek", queue_name, "--json", "--redis-url", redis_url)
    assert out.returncode == 0, out.stderr
    rows = {r["job_id"]: r for r in json.loads(out.stdout)}
    assert rows[failing_id]["reason"] == "unrecoverable" and rows[failing_id]["name"] == "boom"
    assert "no such account 4711" in rows[failing_id]["error"]
    tb = rows[failing_id]["traceback"]  # from the failure record; the DLQ entry's detail holds the same
    assert tb.startswith("Traceback (most recent call last):") and "in boom" in tb
    assert tb.rstrip().endswith("UnrecoverableError: no such account 4711")
    assert rows[failing_id]["detail"] == tb
    assert rows[damaged_id]["error"] is None
    assert "no such account 1" in rows[damaged_id]["traceback"]  # the record is damaged: the DLQ detail
    assert rows[None]["reason"] == "malformed" and rows[None]["error"] is None
    table = chasqui("dlq", "peek", queue_name, "--redis-url", redis_url)
    assert failing_id in table.stdout and "no such account 4711" in table.stdout, table.stdout


def test_filters_longer_than_the_scan_cut_still_match_exactly(redis_url: str, queue_name: str) -> None:
    """Filters are matched on summaries whose fields are cut; a filter longer than the cut must
    neither miss its own entries nor take an entry whose reason merely starts like it, invalid
    UTF-8 reasons (each byte shown as U+FFFD) included."""
    k = QueueKeys.for_queue(queue_name)
    long_reason, longer = "r" * 2000, "r" * 2001
    with redis.Redis.from_url(redis_url) as r:
        for reason in (long_reason, longer, b"\xff" * 1500, b"\xff" * 1501, "r" * 1100):
            r.xadd(k.dlq, {"d": _envelope("L", 1), "n": "long", "reason": reason})
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        assert q.purge_dlq(reason="r" * 1100) == 1
        assert q.purge_dlq(reason=long_reason) == 1
        assert q.purge_dlq(reason="\ufffd" * 1500) == 1
        assert q.replay_dlq_report(10) == {"replayed": 2, "skipped": 0}  # what is left: the two longer
    with redis.Redis.from_url(redis_url) as r:
        assert r.xlen(k.dlq) == 0 and r.xlen(k.stream) == 2
