"""The dashboard's reads are bounded in bytes, not only in entries (issue 26, item 3), and so
are the DLQ tools' (a purge by reason, a replay), tested without a browser on a private Redis 7
whose ``total_net_output_bytes`` counts every byte a request pulled.  The queue holds 1 MiB
payloads: ``/job?id=<any ULID>`` used to read up to 2,000 stream and 1,000 DLQ entries whole
(900 MB sent for one request), ``/dlq?reason=<no match>`` ten windows of 200.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest
from servers import RunningServer, start_server

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.codec import Envelope, encode_envelope
from airflow_provider_chasqui.core.dlq import replay_matching
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.scan import envelope_id, parse_scan, scan_call
from airflow_provider_chasqui.sync._driver import SyncDriver

pytest.importorskip("fastapi", reason="the dashboard extra (fastapi, uvicorn) is not installed")
from airflow_provider_chasqui.dashboard.data import Source

pytestmark = pytest.mark.timeout(180)

MB = 1024 * 1024
BIG = 60  # 1 MiB jobs in the stream, and as many in the DLQ: ~120 MB in Redis
FEW_MB = 6 * MB  # what one request may pull


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    s = start_server("redis7", tmpdir=tmp_path_factory.mktemp("reads"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def big_queue(server: RunningServer) -> tuple[str, list[str], list[str]]:
    """``(queue, stream job ids, DLQ job ids)``: 1 MiB payloads everywhere."""
    name = "big"
    k = QueueKeys.for_queue(name)
    with SyncQueue(name, redis_url=server.url) as q:
        stream_ids = [q.add("big", {"blob": "x" * (MB - 100), "i": i}).id for i in range(BIG)]
        dlq_ids = []
        with server.client() as r:
            for i in range(BIG):
                jid = f"01JDLQ{i:020d}"
                env = encode_envelope(Envelope(jid, msgpack.packb({"blob": "y" * (MB - 100)}), 1700000000000, 3, None))
                r.xadd(k.dlq, {"d": env, "n": "big", "source_id": "1-0", "reason": "retries_exhausted"})
                dlq_ids.append(jid)
    return name, stream_ids, dlq_ids


def _sent(server: RunningServer) -> int:
    with server.client() as r:
        return int(r.info("stats")["total_net_output_bytes"])


def _pulled(server: RunningServer, fn) -> tuple[object, int]:
    before = _sent(server)
    out = fn()
    return out, _sent(server) - before


def test_a_job_lookup_pulls_a_few_mb(server: RunningServer, big_queue) -> None:
    name, stream_ids, dlq_ids = big_queue
    src = Source("t", server.url)
    try:
        unknown, pulled = _pulled(server, lambda: src.job(name, "01JAAAAAAAAAAAAAAAAAAAAAAA"))
        assert unknown is None and pulled < FEW_MB, pulled
        middle = stream_ids[BIG // 2]
        found, pulled = _pulled(server, lambda: src.job(name, middle))
        assert found is not None and found.state == "waiting" and found.id == middle and found.entry_id
        assert found.data["i"] == BIG // 2
        assert pulled < FEW_MB, pulled  # the match itself (1 MiB) and nothing else of size
        dead, pulled = _pulled(server, lambda: src.job(name, dlq_ids[-1]))
        assert dead is not None and dead.state == "failed" and dead.dlq["reason"] == "retries_exhausted"
        assert pulled < FEW_MB, pulled
    finally:
        src.close()


def test_a_dlq_page_with_no_match_pulls_a_few_mb(server: RunningServer, big_queue) -> None:
    name, _stream_ids, dlq_ids = big_queue
    src = Source("t", server.url)
    try:
        page, pulled = _pulled(server, lambda: src.dlq_page(name, None, 50, "no-such-reason", None))
        assert page["rows"] == [] and page["total"] == BIG and pulled < FEW_MB, pulled
        page, pulled = _pulled(server, lambda: src.dlq_page(name, None, 50, "retries_exhausted", None))
        assert [r["job_id"] for r in page["rows"]] == dlq_ids[:50]  # the id, read from a cut envelope
        assert all(r["bytes"] > MB - 200 for r in page["rows"])  # the payload's real size
        assert pulled < FEW_MB, pulled
    finally:
        src.close()


def test_replaying_matches_reads_only_the_chosen_entries(server: RunningServer, big_queue, tmp_path: Path) -> None:
    name = "replay-bounds"
    k = QueueKeys.for_queue(name)
    with server.client() as r:
        for i in range(40):
            env = encode_envelope(Envelope(f"J{i:03d}", msgpack.packb("z" * (MB - 100)), 1700000000000, 3, None))
            r.xadd(k.dlq, {"d": env, "n": "big", "reason": "timeout" if i % 20 == 0 else "retries_exhausted"})
    src = Source("t", server.url)
    try:
        report, pulled = _pulled(server, lambda: src.replay_matching(name, "timeout", None))
        assert report == {"replayed": 2, "skipped": 0}
        assert pulled < 4 * MB, pulled  # the two chosen entries, not the 40
        with server.client() as r:
            assert r.xlen(k.dlq) == 38 and r.xlen(k.stream) == 2
    finally:
        src.close()


def _dead(server: RunningServer, name: str, n: int, reason_of) -> QueueKeys:
    """``n`` 1 MiB DLQ entries of queue ``name``, entry ``i`` with reason ``reason_of(i)``."""
    k = QueueKeys.for_queue(name)
    with server.client() as r:
        for i in range(n):
            env = encode_envelope(Envelope(f"J{i:03d}", msgpack.packb("z" * (MB - 100)), 1700000000000, 3, None))
            r.xadd(k.dlq, {"d": env, "n": "big", "reason": reason_of(i)})
    return k


def test_purging_by_reason_reads_summaries_not_payloads(server: RunningServer) -> None:
    """``purge_dlq(reason=...)`` read whole pages of 500 entries to match them: half a gigabyte a
    round trip with these payloads.  It matches on the scan's summaries and deletes by id."""
    k = _dead(server, "purge-bounds", 40, lambda i: "timeout" if i % 10 == 3 else "retries_exhausted")
    with SyncQueue("purge-bounds", redis_url=server.url) as q:
        # where the purge ends comes as an id alone (stream_ends.lua), then summaries of 1,100
        # bytes an entry: 40 of them, against 1 MiB for any one payload read whole
        removed, pulled = _pulled(server, lambda: q.purge_dlq(reason="timeout"))
        assert removed == 4 and pulled < MB // 4, pulled
        removed, pulled = _pulled(server, lambda: q.purge_dlq(name="big", reason="nope"))
        assert removed == 0 and pulled < MB // 4, pulled
        flow = replay_matching("purge-bounds", "nope", None, 1000)  # the dashboard's replay by reason
        report, pulled = _pulled(server, lambda: q.driver.run(flow))
        assert report == {"replayed": 0, "skipped": 0} and pulled < MB // 4, (report, pulled)
        with server.client() as r:
            left = r.xrange(k.dlq)
        assert len(left) == 36 and {f[b"reason"] for _e, f in left} == {b"retries_exhausted"}
        removed, pulled = _pulled(server, q.purge_dlq)  # the whole DLQ: one XTRIM below the last id
        assert removed == 36 and pulled < 64 * 1024, pulled
        removed, pulled = _pulled(server, q.purge_dlq)
        assert removed == 0 and pulled < 64 * 1024, pulled


def test_a_replay_reads_a_bounded_slice_per_round_trip(server: RunningServer) -> None:
    """``replay_dlq`` must read entries whole (it re-encodes them), but no round trip brings back
    more than ``REPLAY_BYTES`` and the entry that crossed it; every entry is replayed once."""
    from airflow_provider_chasqui.core.dlq import REPLAY_BYTES

    k = _dead(server, "replay-slices", 30, lambda i: "retries_exhausted")
    with SyncQueue("replay-slices", redis_url=server.url) as q:
        flow = q._flows.replay_dlq_report(1000)
        step, sizes = next(flow), []
        try:
            while True:
                reply, pulled = _pulled(server, lambda call=step: q.driver.call(call))
                sizes.append(pulled)
                step = flow.send(reply)
        except StopIteration as done:
            report = done.value
        assert report == {"replayed": 30, "skipped": 0}
        assert max(sizes) < REPLAY_BYTES + 2 * MB, sizes
        assert len(sizes) <= 10, sizes  # a read and a replay per 8 MiB slice, not per entry
        assert sum(sizes) > 30 * MB  # the payloads did come over, in slices
        with server.client() as r:
            assert r.xlen(k.dlq) == 0 and r.xlen(k.stream) == 30
            ids = sorted(msgpack.unpackb(f[b"d"])[0] for _e, f in r.xrange(k.stream))
        assert ids == [f"J{i:03d}" for i in range(30)]


def test_the_scan_script_filters_cuts_and_stops(server: RunningServer) -> None:
    k = QueueKeys.for_queue("scan")
    with server.client() as r:
        for i in range(30):
            r.xadd(k.stream, {"d": b"x" * 1000 + (b"NEEDLE" if i in (7, 21) else b""), "n": "n" * 500})
    d = SyncDriver(server.url)
    try:
        hit = parse_scan(d.call(scan_call(k.stream, "-", count=100, needle=b"NEEDLE", clip=10, max_matches=5)))
        assert hit.done and hit.scanned == 30 and [len(m[1]["n"]) for m in hit.matches] == [10, 10]
        assert all(size == 1006 and len(f["d"]) == 10 for _e, f, size in hit.matches)
        whole = parse_scan(d.call(scan_call(k.stream, "-", count=100, needle=b"NEEDLE", clip=10, whole_d=True)))
        assert len(whole.matches) == 1 and len(whole.matches[0][1]["d"]) == 1006 and not whole.done
        cut = parse_scan(d.call(scan_call(k.stream, "-", count=100, max_bytes=5000, max_matches=100, step=4)))
        assert not cut.done and cut.scanned < 10  # stopped by the byte budget, and says where
        again = parse_scan(d.call(scan_call(k.stream, "(" + cut.last, count=100, max_matches=100)))
        assert again.done and cut.scanned + again.scanned == 30
        empty = parse_scan(d.call(scan_call(QueueKeys.for_queue("none").stream, "-", count=10)))
        assert empty.done and empty.scanned == 0 and empty.matches == []
    finally:
        d.close()


def test_an_envelope_id_is_read_from_its_first_bytes() -> None:
    env = encode_envelope(Envelope("01JID", msgpack.packb("x" * 100_000), 1, 0, None))
    assert envelope_id(env[:1100]) == "01JID" and envelope_id(env) == "01JID"
    for bad in (b"", b"\xc1", msgpack.packb({"a": 1}), msgpack.packb([1, 2, 3, 4]), env[:3]):
        assert envelope_id(bad) is None


def test_queue_names_typed_into_urls_do_not_grow_the_cache(server: RunningServer) -> None:
    """Issue 26: ``/schedules?queue=<any name>`` made a queue object per name, kept for ever."""
    from airflow_provider_chasqui.dashboard.data import QUEUE_CACHE

    src = Source("t", server.url)
    try:
        first = src.queue("typed-0")
        for i in range(QUEUE_CACHE * 3):
            src.queue(f"typed-{i}")
        assert len(src._queues) == QUEUE_CACHE
        assert src.queue("typed-0") is not first  # evicted long ago: made again, sharing the driver
        assert src.queue(f"typed-{QUEUE_CACHE * 3 - 1}").driver is src.driver
    finally:
        src.close()
