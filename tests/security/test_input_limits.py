"""Input limits and key injection: payload and name sizes, and queue names that cannot reach
outside their own ``{chasqui:<queue>}`` hash tag.

Producers refuse oversize jobs before any I/O (a bulk add with one bad item writes nothing);
workers dead-letter oversize or pathological entries written by anyone else.  Queue names
are validated in every constructor before a connection is opened; hypothesis checks that
every key a valid name produces stays under its prefix and in its cluster slot, whatever the
job ids, unique keys or spec keys appended to it.
"""

from __future__ import annotations

import inspect

import pytest
from engine_support import raw_async, running, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from airflow_provider_chasqui import ConfigError, Promoter, Queue, QueueEvents, SyncQueue, Worker
from airflow_provider_chasqui.core.codec import MAX_JOB_NAME_BYTES
from airflow_provider_chasqui.core.keys import MAX_QUEUE_NAME_BYTES, QueueKeys, validate_queue_name
from airflow_provider_chasqui.core.settings import QueueSettings
from airflow_provider_chasqui.engine._driver import AsyncDriver

UNREACHABLE = "redis://127.0.0.1:1/0"  # nothing listens: a constructor that connected would fail differently
INJECTIONS = [
    "q}:stream",
    "{other}",
    "a}{b",
    "x\r\nFLUSHALL\r\n",
    "nul\x00byte",
    "}",
    "{",
    "\n",
    "",
    "x" * (MAX_QUEUE_NAME_BYTES + 1),
    "é" * (MAX_QUEUE_NAME_BYTES // 2 + 1),
]


# ---- queue names --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", INJECTIONS, ids=repr)
def test_every_constructor_rejects_injected_queue_names_before_io(name: str) -> None:
    driver = AsyncDriver(UNREACHABLE)
    for make in (
        lambda: Queue(name, redis_url=UNREACHABLE),
        lambda: SyncQueue(name, redis_url=UNREACHABLE),
        lambda: Worker(name, lambda job: None, redis_url=UNREACHABLE),
        lambda: QueueEvents(name, redis_url=UNREACHABLE),
        lambda: Promoter(driver, name),
        lambda: QueueKeys.for_queue(name),
    ):
        with pytest.raises(ConfigError):
            make()
    for bad_type in (None, 1, b"q", ["q"]):
        with pytest.raises(ConfigError):
            validate_queue_name(bad_type)


def _all_keys(k: QueueKeys, suffix: str) -> list[str]:
    """Every key ``QueueKeys`` can build (properties, and methods fed ``suffix`` / 1)."""
    out = []
    for name in dir(QueueKeys):
        if name.startswith("_") or name in ("for_queue", "queue", "prefix"):
            continue
        attr = getattr(QueueKeys, name)
        if isinstance(attr, property):
            value = getattr(k, name)
        elif callable(attr):
            params = list(inspect.signature(attr).parameters.values())[1:]
            value = getattr(k, name)(*[1 if p.annotation in (int, "int") or "ms" in p.name else suffix for p in params])
        else:
            continue
        if isinstance(value, str):
            out.append(value)
    assert len(out) >= 12, out
    return out


@settings(max_examples=500, deadline=None)
@given(name=st.text(min_size=0, max_size=300), suffix=st.text(max_size=40))
def test_valid_names_stay_inside_their_hash_tag(name: str, suffix: str) -> None:
    """Job ids, unique keys and spec keys are appended after the tag, so even ``}{x`` in them
    cannot move a key to another queue or slot."""
    try:
        k = QueueKeys.for_queue(name)
    except ConfigError:
        assert not name or set(name) & set("{}\r\n\0") or len(name.encode()) > MAX_QUEUE_NAME_BYTES
        return
    assert k.prefix == "{chasqui:" + name + "}"
    slot = key_slot(k.prefix.encode())
    assert slot == key_slot(("chasqui:" + name).encode())
    for key in _all_keys(k, suffix):
        assert key.startswith(k.prefix)
        assert key_slot(key.encode()) == slot, key
    # two different valid names never share a key
    other = name + "x" if len((name + "x").encode()) <= MAX_QUEUE_NAME_BYTES else name[:-1]
    if other and other != name:
        assert not set(_all_keys(k, suffix)) & set(_all_keys(QueueKeys.for_queue(other), suffix))


# ---- payload and name sizes -----------------------------------------------------------------------------
async def test_producer_refuses_oversize_before_any_io(redis_url: str, queue_name: str) -> None:
    small = QueueSettings(max_payload_bytes=1024)
    keys = QueueKeys.for_queue(queue_name)
    async with Queue(queue_name, redis_url=redis_url, settings=small) as q, raw_async(redis_url) as r:
        with pytest.raises(ConfigError, match="max_payload_bytes"):
            await q.add("big", "x" * 2000)
        with pytest.raises(ConfigError, match="max_payload_bytes"):  # one bad item: nothing is written
            await q.add_bulk([{"name": "ok", "data": 1}] * 10 + [{"name": "big", "data": b"x" * 2000}])
        with pytest.raises(ConfigError):
            await q.add("n" * (MAX_JOB_NAME_BYTES + 1), {})
        with pytest.raises(ConfigError):
            await q.add("ok", {}, job_id="j" * 1025)
        with pytest.raises(ConfigError):
            await q.add("ok", {}, delay_ms=float("inf"))
        assert await r.exists(keys.stream, keys.delayed) == 0
        await q.add("ok", "x" * 900)  # under the limit: fine
        assert await r.xlen(keys.stream) == 1
    async with Queue(queue_name, redis_url=redis_url) as q:  # the default limit is 1 MiB
        assert QueueSettings().max_payload_bytes == 1_048_576
        with pytest.raises(ConfigError):
            await q.add("big", b"x" * 1_048_576)


@pytest.mark.timeout(60)
async def test_worker_dead_letters_what_other_producers_send(redis_url: str, queue_name: str) -> None:
    """Oversize, deeply nested and huge-declared-length payloads written straight to the stream."""
    keys = QueueKeys.for_queue(queue_name)
    ran: list[object] = []
    bad = {
        "oversize": b"\x94" + b"\xa0" * 300_000,
        "nested 100k deep": b"\x91" * 100_000 + b"\xc0",
        "declares 4 GiB string": b"\x94\xdb\xff\xff\xff\xff",
        "declares 4G elements": b"\xdd\xff\xff\xff\xff",
    }
    async with raw_async(redis_url) as r:
        ids = {}
        for what, payload in bad.items():
            ids[await r.execute_command("XADD", keys.stream, "*", "d", payload, "n", "h")] = what
        worker = Worker(
            queue_name,
            {"h": lambda job: ran.append(job)},
            redis_url=redis_url,
            run_scheduler=False,
            max_payload_bytes=200_000,
        )
        async with running(worker), Queue(queue_name, redis_url=redis_url) as q:
            dead = await wait_until(lambda: _dlq(q, len(bad)), 15, what="every bad entry in the DLQ")
            ok = await q.add("h", {"still": "alive"})
            await wait_until(lambda: len(ran) == 1, 15, what="a good job after the bad ones")
            assert ran[0].id == ok.id
    reasons = {ids[d["source_id"].encode()]: d["reason"] for d in dead}
    assert reasons == {
        "oversize": "oversize_payload",
        "nested 100k deep": "decode_failed",
        "declares 4 GiB string": "decode_failed",
        "declares 4G elements": "decode_failed",
    }


async def _dlq(q: Queue, n: int):
    rows = await q.peek_dlq(100)
    return rows if len(rows) >= n else None


def test_settings_reject_unbounded_values() -> None:
    for field in ("max_stream_len", "max_payload_bytes", "events_max_len", "dlq_max_len"):
        for bad in (0, -1, None, 1.5, True):
            with pytest.raises(ConfigError):
                QueueSettings(**{field: bad})
