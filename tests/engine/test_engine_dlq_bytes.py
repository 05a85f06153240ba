"""DLQ entries keep every original byte, the name too (issue #12), on Redis 7.0 and Valkey 8.1:
a job whose name is not UTF-8 reaches its handler with the name decoded (U+FFFD), and when it
is dead-lettered (unrecoverable, retries exhausted, after a retry through the delayed set) the
DLQ's ``n`` holds the name's original bytes and ``d`` the entry's original payload bytes;
``replay_dlq`` moves both back byte for byte (attempt reset to 0)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from engine_support import kv, pending_count, running, wait_until
from servers import RunningServer

from airflow_provider_chasqui import Job, UnrecoverableError
from airflow_provider_chasqui.core.codec import (
    Envelope,
    decode_envelope,
    encode_envelope,
)
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.retry import RetryPolicy

BAD_NAME = b"\xff\xfe-job-\x80\xc3("  # not UTF-8 (a stray continuation byte, a truncated pair)
SHOWN = BAD_NAME.decode("utf-8", "replace")

# Redis 7.0 and Valkey 8.1, the worker's server fast paths auto-detected
pytestmark = pytest.mark.parametrize("compat_mode", [False], ids=["auto"], indirect=True)


@pytest.fixture(scope="session", params=("redis7", "valkey8"))
def server_matrix(request: pytest.FixtureRequest, _server_pool: Callable[[str], RunningServer]) -> RunningServer:
    return _server_pool(request.param)


def _map_envelope(job_id: str, data: Any) -> bytes:
    """serde's map form of an envelope: decodes like the array form, re-encodes differently,
    so only the original bytes can match it."""
    return msgpack.packb(
        {"id": job_id, "payload": msgpack.packb(data), "created_at_ms": 1_700_000_000_000, "attempt": 0},
        use_bin_type=True,
    )


@pytest.mark.timeout(120)
async def test_dead_letters_keep_the_original_name_and_payload_bytes(
    matrix_url: Any, queue_name: str, clients: Any, queues: Any, worker_factory: Any
) -> None:
    url, k = matrix_url.url, QueueKeys.for_queue(queue_name)
    r = clients(url)
    q = queues(queue_name, url)
    fatal = _map_envelope("J-fatal", {"kind": "fatal"})  # unrecoverable on its first run
    worn = encode_envelope(Envelope("J-worn", msgpack.packb({"kind": "worn"}), 1_700_000_000_000))  # fails twice
    routed = encode_envelope(Envelope("J-good", msgpack.packb({"kind": "good"}), 1_700_000_000_000))
    sources = {}
    for d in (fatal, worn, routed):
        sources[d] = (await r.xadd(k.stream, {"d": d, "n": BAD_NAME})).decode()
    seen: list[tuple[str, str, int]] = []

    async def handler(job: Job) -> str:
        seen.append((job.id, job.name, job.attempt))
        if job.data["kind"] == "fatal":
            raise UnrecoverableError("no")
        if job.data["kind"] == "worn":
            raise ValueError("boom")
        return "ok"

    w = worker_factory(
        queue_name,
        handler,
        url,
        max_attempts=2,
        concurrency=2,
        retry=RetryPolicy(initial_ms=5, max_ms=50, multiplier=2.0, jitter_ms=0),
    )
    async with running(w):
        await wait_until(lambda: _dlq_len(r, k.dlq, 2), timeout=60, what="two dead letters")
        await wait_until(lambda: _pending_zero(r, queue_name), timeout=30, what="nothing pending")
    # handlers saw a str, the undecodable bytes replaced
    assert sorted(seen) == [("J-fatal", SHOWN, 0), ("J-good", SHOWN, 0), ("J-worn", SHOWN, 0), ("J-worn", SHOWN, 1)]
    rows = {decode_envelope(dict(kv(f))["d"]).id: (eid, kv(f)) for eid, f in await r.xrange(k.dlq)}
    assert set(rows) == {"J-fatal", "J-worn"}
    # unrecoverable: the entry as it arrived, byte for byte (map-form payload and all)
    assert rows["J-fatal"][1][:4] == [
        ("d", fatal),
        ("n", BAD_NAME),
        ("source_id", sources[fatal].encode()),
        ("reason", b"unrecoverable"),
    ]
    # retries exhausted after a retry through the delayed set: the name's bytes survived the
    # retry member and the promotion; the payload is the retried entry's (attempt 1)
    worn_fields = dict(rows["J-worn"][1])
    assert worn_fields["n"] == BAD_NAME and worn_fields["reason"] == b"retries_exhausted"
    assert worn_fields["d"] == encode_envelope(decode_envelope(worn).with_attempt(1))
    # replay: both back on the stream with the original name bytes and attempt 0
    assert await q.replay_dlq() == 2
    back = {decode_envelope(dict(kv(f))["d"]).id: dict(kv(f)) for _eid, f in await r.xrange(k.stream)}
    assert set(back) == {"J-fatal", "J-worn"}
    assert all(f["n"] == BAD_NAME for f in back.values())
    assert back["J-worn"]["d"] == worn  # the original envelope again, byte for byte
    replayed = decode_envelope(back["J-fatal"]["d"])
    assert (replayed.attempt, msgpack.unpackb(replayed.inner)) == (0, {"kind": "fatal"})
    assert await r.xlen(k.dlq) == 0


async def _dlq_len(r: Any, key: str, n: int) -> bool:
    return await r.xlen(key) >= n


async def _pending_zero(r: Any, queue: str) -> bool:
    return await pending_count(r, queue) == 0
