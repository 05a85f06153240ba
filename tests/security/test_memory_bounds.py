"""Memory hygiene: nothing the engine writes grows without bound by default.

* the job stream, the events stream and the DLQ are written with ``MAXLEN ~``: with small
  limits their lengths stay within one stream node (``stream-node-max-entries``, 100) of the
  limit however much flows through;
* result and failure records carry a TTL and are capped by count per queue (the newest
  ``results_max_len`` / ``failures_max_len`` are kept; the oldest go in the script that writes
  new ones); unique markers, idempotency keys and leader locks expire on their own;
* after a mixed workload every key of the queue either expires or is one of the bounded
  structures above (plus the repeatable-spec index, bounded by the specs the user keeps).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from engine_support import raw_async, running, wait_until
from fault_support import chunks

from airflow_provider_chasqui import Queue, RepeatPattern, UnrecoverableError, Worker, WorkerSettings
from airflow_provider_chasqui.core.features import Features
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.settings import QueueSettings
from airflow_provider_chasqui.errors import ConfigError

NODE = 100  # stream-node-max-entries: MAXLEN ~ trims whole nodes, so a stream may exceed its limit by < 1 node


def test_defaults_are_bounded() -> None:
    q = QueueSettings()
    assert (q.max_stream_len, q.events_max_len, q.dlq_max_len) == (1_000_000, 100_000, 100_000)
    assert q.max_payload_bytes == 1_048_576 and q.unique_window_ms > 0
    assert q.results_max_len == q.failures_max_len == 10_000
    w = WorkerSettings()
    assert w.store_results is False  # results are opt-in
    assert w.result_ttl_ms == w.failure_ttl_ms == 24 * 3600 * 1000
    worker = Worker("bounded", lambda job: None)
    assert worker.core.events_max == 100_000 and worker.core.settings.dlq_max_len == 100_000


def test_the_caps_are_settable_from_the_worker_command_line() -> None:
    from airflow_provider_chasqui.worker.cli import build_parser, worker_options

    args = build_parser().parse_args(["--queue", "q", "--handlers", "m", "--max-results", "7", "--max-failures", "9"])
    worker = Worker("q", lambda job: None, **worker_options(args))
    assert worker.settings.store_results is True  # chasqui worker stores results by default
    assert (worker.core.settings.results_max_len, worker.core.settings.failures_max_len) == (7, 9)
    call = worker.core.complete([], Features(xackdel=False), 1)
    assert call.argv[6] == 7
    defaults = Worker("q", lambda job: None, **worker_options(build_parser().parse_args(["-q", "q", "-H", "m"])))
    assert defaults.core.settings.results_max_len == 10_000
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["-q", "q", "-H", "m", "--max-results", bad])
    with pytest.raises(ConfigError, match="results_max_len"):
        QueueSettings(results_max_len=0)


async def _watch_max(r, key: str, stop: asyncio.Event) -> int:
    """Largest XLEN seen while the workload runs (sampled, not just at the end)."""
    top = 0
    while not stop.is_set():
        top = max(top, int(await r.execute_command("XLEN", key)))
        await asyncio.sleep(0.005)
    return max(top, int(await r.execute_command("XLEN", key)))


@pytest.mark.timeout(120)
async def test_events_dlq_and_stream_stay_near_their_max_len(redis_url: str, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    done: list[int] = []

    async def ok(job) -> None:
        done.append(job.data["i"])

    async def bad(job) -> None:
        raise UnrecoverableError("to the DLQ")

    async with raw_async(redis_url) as r, Queue(queue_name, redis_url=redis_url) as q:
        r.response_callbacks.clear()
        stop = asyncio.Event()
        watchers = [asyncio.create_task(_watch_max(r, k, stop)) for k in (keys.events, keys.dlq)]
        for part in chunks(list(range(3000)), 500):
            await q.add_bulk([{"name": "ok" if i % 3 else "bad", "data": {"i": i}} for i in part])
        worker = Worker(
            queue_name,
            {"ok": ok, "bad": bad},
            redis_url=redis_url,
            run_scheduler=False,
            events_max_stream_len=100,
            dlq_max_stream_len=50,
        )
        async with running(worker):
            await wait_until(lambda: len(done) == 2000, 60, what="the ok jobs")
            await wait_until(lambda: _xlen(r, keys.stream, 0), 30, what="the stream to drain")
        stop.set()
        events_top, dlq_top = await asyncio.gather(*watchers)
        # The producer side: a stream capped at 100 while nobody consumes.
        async with Queue(queue_name + "-s", redis_url=redis_url, max_stream_len=100) as capped:
            for part in chunks(list(range(2000)), 250):
                await capped.add_bulk([{"name": "x", "data": i} for i in part])
            for i in range(300):
                await capped.add("x", i)
            stream_len = int(await r.execute_command("XLEN", QueueKeys.for_queue(queue_name + "-s").stream))
            await r.delete(QueueKeys.for_queue(queue_name + "-s").stream)
    assert 100 <= events_top < 100 + NODE, events_top
    assert 50 <= dlq_top < 50 + NODE, dlq_top
    assert 100 <= stream_len < 100 + NODE, stream_len
    print(
        f"\n[memory] events max_len=100 peak XLEN={events_top} (6000+ events written); dlq max_len=50 peak "
        f"XLEN={dlq_top} (1000 dead); stream max_len=100 XLEN={stream_len} (2300 added)"
    )


async def _xlen(r, key: str, want: int) -> bool:
    return int(await r.execute_command("XLEN", key)) == want


@pytest.mark.timeout(120)
async def test_results_failures_and_markers_expire(redis_url: str, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    async with raw_async(redis_url) as r, Queue(queue_name, redis_url=redis_url) as q:
        r.response_callbacks.clear()
        oks = [await q.add("ok", {"i": i}) for i in range(5)]
        bads = [await q.add("bad", {"i": i}) for i in range(5)]
        unique = await q.add_unique("ok", {"u": 1}, key="u-1", window=timedelta(seconds=30))
        await q.add("ok", {"later": 1}, delay_ms=60_000, job_id="d-1")

        async def ok(job) -> str:
            return "r" * 100

        async def bad(job) -> None:
            raise UnrecoverableError("no")

        worker = Worker(
            queue_name,
            {"ok": ok, "bad": bad},
            redis_url=redis_url,
            run_scheduler=False,
            store_results=True,
            result_ttl=timedelta(seconds=40),
            failure_ttl_ms=20_000,
        )
        async with running(worker):
            for job in oks:
                assert await q.wait_for_result(job.id, timeout=15) == "r" * 100
            await wait_until(lambda: _all_exist(r, [keys.failure(b.id) for b in bads]), 15, what="failure records")
            ttls = {
                "result": [int(await r.execute_command("PTTL", keys.result(j.id))) for j in oks],
                "failure": [int(await r.execute_command("PTTL", keys.failure(j.id))) for j in bads],
                "unique": [int(await r.execute_command("PTTL", keys.unique("u-1")))],
                "dlid": [int(await r.execute_command("PTTL", keys.dlid("d-1")))],
                "didx": [int(await r.execute_command("PTTL", keys.didx("d-1")))],
                "promoter lock": [int(await r.execute_command("PTTL", keys.promoter_lock))],
            }
    assert unique.id
    assert all(0 < t <= 40_000 for t in ttls["result"]), ttls
    assert all(0 < t <= 20_000 for t in ttls["failure"]), ttls
    assert 0 < ttls["unique"][0] <= 30_000
    assert all(ttls[k][0] > 0 for k in ("dlid", "didx", "promoter lock")), ttls


async def _scan(r, pattern: str) -> list[bytes]:
    out: list[bytes] = []
    cursor = b"0"
    while True:  # raw replies (callbacks cleared): the cursor is bytes, so no scan_iter
        cursor, batch = await r.execute_command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        out += batch
        if cursor in (b"0", 0):
            return out


def _glob(text: str) -> str:
    return text.replace("[", "\\[").replace("*", "\\*").replace("?", "\\?")


@pytest.mark.timeout(120)
async def test_results_and_failure_records_are_capped_by_count(redis_url: str, queue_name: str) -> None:
    """Issue #12: results (stored by default by ``chasqui worker``) and failure records were
    bounded only by their 24 h TTL, so a sustained rate grew Redis without bound.  With caps of
    40 and 30, 1,500 results and 600 failures leave at most the cap (plus the jobs of one batch
    in flight) of each, the newest ones, and the indexes stay at the cap."""
    keys = QueueKeys.for_queue(queue_name)
    done: list[int] = []

    async def ok(job) -> str:
        done.append(job.data["i"])
        return "r" * 200

    async def bad(job) -> None:
        done.append(job.data["i"])
        raise UnrecoverableError("x" * 100_000)  # a huge reason: clipped in events and records

    async with raw_async(redis_url) as r, Queue(queue_name, redis_url=redis_url) as q:
        r.response_callbacks.clear()
        items = [{"name": "bad" if i % 5 == 0 else "ok", "data": {"i": i}} for i in range(2100)]
        jobs = []
        for part in chunks(items, 500):
            jobs += await q.add_bulk(part)
        worker = Worker(
            queue_name,
            {"ok": ok, "bad": bad},
            redis_url=redis_url,
            run_scheduler=False,
            store_results=True,
            results_max_len=40,
            failures_max_len=30,
        )
        async with running(worker):
            await wait_until(lambda: len(done) == len(items), 60, what="every job")
            await wait_until(lambda: _xlen(r, keys.stream, 0), 30, what="the stream to drain")
        results = await _scan(r, _glob(keys.prefix) + ":result:*")
        failures = await _scan(r, _glob(keys.prefix) + ":failure:*")
        result_index = int(await r.execute_command("ZCARD", keys.results))
        failure_index = int(await r.execute_command("ZCARD", keys.failures))
        # the newest are kept: every kept result is of a job among the last ones to run (the cap
        # plus an ack batch and the slots in flight; completion order within them varies)
        ok_order = [i for i in done if i % 5]
        recent = {jobs[i].id for i in ok_order[-(40 + 256 + 100) :]}
        kept = [k.decode().rsplit(":", 1)[1] for k in results]
        assert kept and set(kept) <= recent, sorted(set(kept) - recent)[:5]
        assert all([await q.get_job_result(j) == "r" * 200 for j in kept])
        records = [await r.execute_command("GET", k) for k in failures]
        events = await r.execute_command("XRANGE", keys.events, "-", "+")
    assert len(done) == 2100
    assert 0 < len(results) <= 40 and result_index == len(results), (len(results), result_index)
    assert 0 < len(failures) <= 30 and failure_index == len(failures), (len(failures), failure_index)
    # a record is its reason (4 KiB) plus the handler's traceback (4 KiB, innermost frames kept)
    assert all(len(rec) <= 2 * 4096 + 64 for rec in records)
    assert all(b"Traceback (most recent call last)" in rec for rec in records)
    reasons = [f[f.index(b"reason") + 1] for _id, f in events if f[1] == b"failed"]
    assert reasons and max(len(x) for x in reasons) <= 4096
    print(
        f"\n[memory] 1680 results / 420 failures written; kept {len(results)} results (cap 40) and "
        f"{len(failures)} failure records (cap 30)"
    )


async def _all_exist(r, names: list[str]) -> bool:
    return int(await r.execute_command("EXISTS", *names)) == len(names)


@pytest.mark.timeout(120)
async def test_key_census_after_a_mixed_workload(redis_url: str, queue_name: str) -> None:
    """Every key left behind expires, or is a bounded structure."""
    keys = QueueKeys.for_queue(queue_name)
    bounded = {
        keys.stream: "MAXLEN",
        keys.events: "MAXLEN",
        keys.dlq: "MAXLEN",
        keys.delayed: "drained by the promoter",
        keys.repeat: "one member per spec the user keeps",
    }
    runs: list[str] = []

    async def ok(job) -> str:
        runs.append(job.name)
        return "ok"

    async def flaky(job) -> None:
        if job.attempt < 1:
            raise RuntimeError("retry me")

    async def bad(job) -> None:
        raise UnrecoverableError("dead")

    async with raw_async(redis_url) as r, Queue(queue_name, redis_url=redis_url) as q:
        r.response_callbacks.clear()
        await q.add_bulk([{"name": "ok", "data": i} for i in range(200)])
        await q.add("flaky", {}, backoff=10)
        await q.add("bad", {})
        await q.add_unique("ok", {}, key="once")
        await q.add("ok", {}, job_id="with-id")
        await q.add("ok", {}, delay_ms=30, job_id="delayed-id")
        await q.add("ok", {}, delay_ms=60_000, job_id="cancel-me")
        assert await q.cancel_delayed("cancel-me")
        await q.upsert_repeatable_job("ok", {}, repeat=RepeatPattern.every(100), key="spec-kept")
        await q.upsert_repeatable_job("ok", {}, repeat=RepeatPattern.every(100), key="spec-removed")
        worker = Worker(
            queue_name,
            {"ok": ok, "flaky": flaky, "bad": bad},
            redis_url=redis_url,
            store_results=True,
            run_scheduler=True,
            scheduler_tick_ms=20,
            promoter_poll_ms=20,
        )
        async with running(worker):
            await wait_until(lambda: runs.count("ok") >= 203 + 2, 30, what="plain, unique, delayed and fired jobs")
            assert await q.remove_repeatable_by_key("spec-removed")
            await wait_until(lambda: _xlen(r, keys.stream, 0), 30, what="the stream to drain")
        left: dict[str, int] = {}
        pattern = keys.prefix.replace("[", "\\[").replace("*", "\\*").replace("?", "\\?") + "*"
        cursor = b"0"
        while True:  # raw replies (callbacks cleared): the cursor is bytes, so no scan_iter
            cursor, batch = await r.execute_command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            for key in batch:
                left[key.decode()] = int(await r.execute_command("PTTL", key))
            if cursor in (b"0", 0):
                break
    persistent = {k for k, ttl in left.items() if ttl == -1}
    spec_storage = {k for k in persistent if k.startswith(keys.prefix + ":repeat")}
    unexpected = persistent - set(bounded) - spec_storage
    assert not unexpected, f"keys with no TTL and no bound: {sorted(unexpected)}"
    assert not any("spec-removed" in k for k in left), "a removed spec left keys behind"
    assert all(k.startswith(keys.prefix) for k in left)
    print(
        f"\n[memory census] {len(left)} keys left: {len(persistent)} persistent "
        f"({sorted(k.removeprefix(keys.prefix) for k in persistent)}), {len(left) - len(persistent)} with a TTL"
    )


def test_the_key_table_names_every_key_the_code_writes() -> None:
    """SECURITY.md's table of keys and ``QueueKeys`` (where every key is built) agree both ways;
    ``<...>`` stands for any id, name or token."""
    import inspect as pyinspect
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "SECURITY.md").read_text()
    table = text[text.index("| Key of queue `q`") :].split("\n\n", 1)[0]
    documented = set()
    for line in table.splitlines()[2:]:
        first = line.split("|")[1]
        documented |= {re.sub(r"<[^>]+>", "<>", k) for k in re.findall(r"`([^`]+)`", first)}
    k = QueueKeys.for_queue("q")
    built = set()
    for name, member in pyinspect.getmembers(QueueKeys):
        if name.startswith("_") or name in ("for_queue", "prefix", "queue"):
            continue
        if isinstance(member, property):
            built.add(getattr(k, name)[len(k.prefix) :])
        elif callable(member):
            n = len(pyinspect.signature(member).parameters) - 1
            built.add(member(k, *["<>"] * n)[len(k.prefix) :])
    patterns = {b: re.compile(re.escape(b).replace("<>", ".+") + "$") for b in built}
    assert [d for d in documented if not any(p.match(d) for p in patterns.values())] == []
    assert [b for b, p in patterns.items() if not any(p.match(d) for d in documented)] == []
    # and no module builds a queue's key by hand
    pkg = Path(__file__).resolve().parents[2] / "airflow_provider_chasqui"
    hand = [
        str(f.relative_to(pkg))
        for f in pkg.rglob("*.py")
        if f.name != "keys.py" and re.search(r"prefix \+ [\"']:|\.prefix}:", f.read_text())
    ]
    assert hand == []
