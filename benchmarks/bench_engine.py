"""Engine throughput against the plain client's limits, in one run on one Redis.

    python benchmarks/bench_engine.py               # N=20,000, median of 3 (a few minutes)
    python benchmarks/bench_engine.py --smoke       # N=500, one run (seconds)
    python benchmarks/bench_engine.py --redis-url redis://127.0.0.1:6379/0   # reuse a server

Without ``--redis-url`` a private ``redis-server`` is started on a free loopback port and
stopped at the end.  Workloads (jobs are tiny: ``{"i": n}`` named ``noop``):

* limits: raw redis-py XADD one by one (sync and asyncio) and sync pipelined XADD (1,000 per
  pipeline), sending exactly the command ``Queue.add`` sends, with a pre-encoded envelope;
  plus one EVALSHA of ``enqueue_batch`` per 1,000 pre-encoded jobs (the batch path's server cost);
  plus ``limit_thread_handoff_16``: 16 threads passing a baton with no Redis at all (the
  interpreter's floor for threads that each wait for their own answer, as ``SyncQueue.add`` does);
  plus ``ref_redis_floor``: a plain client doing a worker's Redis commands for N queued jobs
  (read, ``active`` events, ack, delete, ``completed`` events; pipelined), Redis's floor per job;
* ``Queue.add`` / ``SyncQueue.add`` one by one, ``Queue.add_bulk`` / ``SyncQueue.add_bulk`` in
  batches of 1,000 (jobs built, validated and encoded inside the timing);
* end-to-end: N jobs already queued, one worker *process* (``_engine_worker.py``: concurrency
  50, events on, results off, scheduler off) processes them; throughput is N over the span
  from the first ``active`` to the last ``completed`` event (Redis clock), CPU is the worker
  process's getrusage over ``Worker.run()`` divided by N, Redis CPU the ``INFO cpu`` delta over
  the same run divided by N, and its two-core bound ``1 / max(worker us, Redis us)`` per job;
  ``e2e_process_uvloop`` is the same worker on uvloop (when installed),
  ``e2e_rate_unbounded`` the same under a rate limit it never reaches (the limiter's own cost),
  ``e2e_concurrency_unbounded`` under a concurrency limit it never reaches (the slots' cost);
* delayed end-to-end: N jobs added with a 1 s delay, the worker starts once all are due:
  promotion plus processing, from the first ``active`` event to the last ``completed``;
* retries: every job fails once and succeeds on its retry (backoff 0 ms + the policy's jitter),
  from the first ``active`` to the last ``completed`` event.

Prints a table (median jobs/s, ratio to the relevant limit) and writes
``benchmarks/results/engine.json`` (``--out`` to change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
import redis.asyncio as aioredis
from _common import RESULTS, log, machine, median_of, private_redis, redis_version, write_json

from airflow_provider_chasqui.core.codec import Envelope, encode_data, encode_envelope, new_job_id, now_ms
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.scripts import SCRIPTS
from airflow_provider_chasqui.engine.queue import Queue
from airflow_provider_chasqui.sync.queue import SyncQueue

HERE = Path(__file__).resolve().parent
BATCH = 1000
MAXLEN = 1_000_000  # QueueSettings.max_stream_len, so the raw commands equal ours
NAME = "noop"


# ---- helpers ----------------------------------------------------------------------------
def _queue_name(tag: str) -> str:
    return f"bench-{tag}-{uuid.uuid4().hex[:8]}"


def _cleanup(url: str, queue: str) -> None:
    r = redis.Redis.from_url(url)
    try:
        keys = list(
            r.scan_iter(
                match=QueueKeys.for_queue(queue).prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=1000
            )
        )
        for i in range(0, len(keys), 500):
            r.delete(*keys[i : i + 500])
    finally:
        r.close()


def _envelope() -> bytes:
    return encode_envelope(Envelope(new_job_id(), encode_data({"i": 1}), now_ms(), 0))


def _result(n: int, wall: float, cpu: float | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs_per_s": n / wall, "seconds": wall}
    if cpu is not None:
        out["client_cpu_us_per_job"] = cpu / n * 1e6
    return out


def _timed(fn: Callable[[], None], n: int) -> dict[str, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return _result(n, wall, cpu)


def _timed_async(factory: Callable[[], Any], n: int) -> dict[str, Any]:
    """``factory()`` returns (setup coroutine fn, timed coroutine fn, teardown coroutine fn)."""

    async def main() -> dict[str, Any]:
        setup, body, teardown = factory()
        await setup()
        try:
            c0, t0 = time.process_time(), time.perf_counter()
            await body()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        finally:
            await teardown()
        return _result(n, wall, cpu)

    return asyncio.run(main())


# ---- limits -----------------------------------------------------------------------------
def limit_sync_xadd_single(url: str, n: int) -> dict[str, Any]:
    q = _queue_name("raw1")
    key, env = QueueKeys.for_queue(q).stream, _envelope()
    r = redis.Redis.from_url(url)
    r.ping()

    def body() -> None:
        for _ in range(n):
            r.execute_command("XADD", key, "MAXLEN", "~", MAXLEN, "*", "d", env, "n", NAME)

    try:
        return _timed(body, n)
    finally:
        r.close()
        _cleanup(url, q)


def limit_sync_xadd_pipeline(url: str, n: int) -> dict[str, Any]:
    q = _queue_name("rawp")
    key, env = QueueKeys.for_queue(q).stream, _envelope()
    r = redis.Redis.from_url(url)
    r.ping()

    def body() -> None:
        for start in range(0, n, BATCH):
            pipe = r.pipeline(transaction=False)
            for _ in range(min(BATCH, n - start)):
                pipe.execute_command("XADD", key, "MAXLEN", "~", MAXLEN, "*", "d", env, "n", NAME)
            pipe.execute()

    try:
        return _timed(body, n)
    finally:
        r.close()
        _cleanup(url, q)


def _event_xadds(pipe: Any, key: str, count: int, now: str, kind: str, *extra: Any) -> None:
    """``count`` events of ``kind`` as a worker's scripts write them, queued on ``pipe``."""
    for i in range(count):
        pipe.execute_command("XADD", key, "*", "e", kind, "id", f"j{i}", "ts", now, "n", NAME, "attempt", 1, *extra)


def limit_thread_handoff_16(url: str, n: int) -> dict[str, Any]:
    """The interpreter's own floor for threads that each wait for their own answer: 16 threads
    in a ring pass one baton (a raw lock each), no Redis at all.  A ``SyncQueue.add`` from a
    thread that must wait until its job is written costs at least one such hand-off."""
    locks = [threading.Lock() for _ in range(16)]
    for lock in locks:
        lock.acquire()
    per = max(1, n // 16)

    def ring(i: int) -> None:
        mine, theirs = locks[i], locks[(i + 1) % 16]
        for _ in range(per):
            mine.acquire()
            theirs.release()

    def body() -> None:
        threads = [threading.Thread(target=ring, args=(i,)) for i in range(16)]
        for th in threads:
            th.start()
        locks[0].release()
        for th in threads:
            th.join()

    return _timed(body, per * 16)


def ref_redis_floor(url: str, n: int) -> dict[str, Any]:
    """Redis's floor per job for what a worker asks of it (issue 27): a plain redis-py client
    reads N queued jobs (``XREADGROUP COUNT 256``) and, per batch, in one pipeline, writes their
    ``active`` events, acks and deletes them (``XACK``, ``XDEL`` of the batch) and writes their
    ``completed`` events, as the wire has a worker do, with no script, no handler and no
    bookkeeping.  ``redis_cpu_us_per_job`` (INFO cpu over the loop) is the figure the worker's
    Redis CPU per job is compared with."""
    q = _queue_name("floor")
    k = QueueKeys.for_queue(q)
    _fill(url, q, n)
    r = redis.Redis.from_url(url)
    r.execute_command("XGROUP", "CREATE", k.stream, "floor", "0", "MKSTREAM")
    done = 0

    def body() -> None:
        nonlocal done
        while done < n:
            reply = r.execute_command("XREADGROUP", "GROUP", "floor", "c1", "COUNT", 256, "STREAMS", k.stream, ">")
            rows = reply[0][1] if reply else []
            if not rows:
                break
            ids = [eid for eid, _f in rows]
            now = str(int(time.time() * 1000))
            pipe = r.pipeline(transaction=False)

            _event_xadds(pipe, k.events, len(ids), now, "active")
            pipe.execute_command("XACK", k.stream, "floor", *ids)
            pipe.execute_command("XDEL", k.stream, *ids)
            _event_xadds(pipe, k.events, len(ids), now, "completed", "duration_us", 3)
            pipe.execute_command("XTRIM", k.events, "MAXLEN", "~", 100_000)  # once a batch, as our scripts do
            pipe.execute()
            done += len(ids)

    try:
        cpu0 = _redis_cpu(url)
        res = _timed(body, n)
        res["redis_cpu_us_per_job"] = (_redis_cpu(url) - cpu0) / n * 1e6
        if done != n:
            raise RuntimeError(f"floor probe read {done} of {n} jobs")
        return res
    finally:
        r.close()
        _cleanup(url, q)


def ref_async_xadd_single(url: str, n: int) -> dict[str, Any]:
    q = _queue_name("rawa")
    key, env = QueueKeys.for_queue(q).stream, _envelope()
    box: dict[str, Any] = {}

    def factory() -> Any:
        async def setup() -> None:
            box["r"] = aioredis.Redis.from_url(url)
            await box["r"].ping()

        async def body() -> None:
            r = box["r"]
            for _ in range(n):
                await r.execute_command("XADD", key, "MAXLEN", "~", MAXLEN, "*", "d", env, "n", NAME)

        async def teardown() -> None:
            await box["r"].aclose()

        return setup, body, teardown

    try:
        return _timed_async(factory, n)
    finally:
        _cleanup(url, q)


def ref_sync_lua_batch(url: str, n: int) -> dict[str, Any]:
    """Server-side cost of the batch path: ``enqueue_batch`` with pre-encoded envelopes."""
    q = _queue_name("rawl")
    key, env = QueueKeys.for_queue(q).stream, _envelope()
    script = SCRIPTS["enqueue_batch"]
    r = redis.Redis.from_url(url)
    r.script_load(script.body)

    def body() -> None:
        for start in range(0, n, BATCH):
            argv: list[Any] = [MAXLEN]
            for _ in range(min(BATCH, n - start)):
                argv += (env, NAME)
            r.execute_command("EVALSHA", script.sha, 1, key, *argv)

    try:
        return _timed(body, n)
    finally:
        r.close()
        _cleanup(url, q)


# ---- our producers ----------------------------------------------------------------------
def queue_add(url: str, n: int) -> dict[str, Any]:
    qn = _queue_name("add")
    box: dict[str, Any] = {}

    def factory() -> Any:
        async def setup() -> None:
            box["q"] = Queue(qn, redis_url=url)
            await box["q"].add(NAME, {"i": -1})  # connect before the clock starts

        async def body() -> None:
            q = box["q"]
            for i in range(n):
                await q.add(NAME, {"i": i})

        async def teardown() -> None:
            await box["q"].close()

        return setup, body, teardown

    try:
        return _timed_async(factory, n)
    finally:
        _cleanup(url, qn)


def _queue_add_tasks(url: str, n: int, tasks: int) -> dict[str, Any]:
    """``tasks`` tasks share one Queue, each awaiting its own adds one at a time (a web app's
    handlers): the coalescing producer's case (engine/coalesce.py)."""
    qn = _queue_name(f"addt{tasks}")
    box: dict[str, Any] = {}
    per = max(1, n // tasks)

    def factory() -> Any:
        async def setup() -> None:
            box["q"] = Queue(qn, redis_url=url)
            await box["q"].add(NAME, {"i": -1})

        async def body() -> None:
            q = box["q"]

            async def one(t: int) -> None:
                for i in range(per):
                    await q.add(NAME, {"i": i, "t": t})

            await asyncio.gather(*(one(t) for t in range(tasks)))

        async def teardown() -> None:
            await box["q"].close()

        return setup, body, teardown

    try:
        return _timed_async(factory, per * tasks)
    finally:
        _cleanup(url, qn)


def queue_add_tasks_100(url: str, n: int) -> dict[str, Any]:
    return _queue_add_tasks(url, n, 100)


def queue_add_tasks_1000(url: str, n: int) -> dict[str, Any]:
    return _queue_add_tasks(url, n, 1000)


def syncqueue_add_threads_16(url: str, n: int) -> dict[str, Any]:
    """16 threads share one SyncQueue, each adding one job at a time (Flask, Django, Airflow tasks)."""
    qn = _queue_name("sthr")
    q = SyncQueue(qn, redis_url=url)
    q.add(NAME, {"i": -1})
    per = max(1, n // 16)

    def one(t: int) -> None:
        for i in range(per):
            q.add(NAME, {"i": i, "t": t})

    def body() -> None:
        threads = [threading.Thread(target=one, args=(t,)) for t in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    try:
        return _timed(body, per * 16)
    finally:
        q.close()
        _cleanup(url, qn)


def queue_add_bulk(url: str, n: int) -> dict[str, Any]:
    qn = _queue_name("bulk")
    box: dict[str, Any] = {}

    def factory() -> Any:
        async def setup() -> None:
            box["q"] = Queue(qn, redis_url=url)
            await box["q"].add_bulk([{"name": NAME, "data": {"i": -1}}])

        async def body() -> None:
            q = box["q"]
            for start in range(0, n, BATCH):
                await q.add_bulk([{"name": NAME, "data": {"i": i}} for i in range(start, min(n, start + BATCH))])

        async def teardown() -> None:
            await box["q"].close()

        return setup, body, teardown

    try:
        return _timed_async(factory, n)
    finally:
        _cleanup(url, qn)


def syncqueue_add(url: str, n: int) -> dict[str, Any]:
    qn = _queue_name("sadd")
    q = SyncQueue(qn, redis_url=url)
    q.add(NAME, {"i": -1})

    def body() -> None:
        for i in range(n):
            q.add(NAME, {"i": i})

    try:
        return _timed(body, n)
    finally:
        q.close()
        _cleanup(url, qn)


def syncqueue_add_bulk(url: str, n: int) -> dict[str, Any]:
    qn = _queue_name("sbulk")
    q = SyncQueue(qn, redis_url=url)
    q.add_bulk([{"name": NAME, "data": {"i": -1}}])

    def body() -> None:
        for start in range(0, n, BATCH):
            q.add_bulk([{"name": NAME, "data": {"i": i}} for i in range(start, min(n, start + BATCH))])

    try:
        return _timed(body, n)
    finally:
        q.close()
        _cleanup(url, qn)


# ---- end to end -------------------------------------------------------------------------
def _fill(url: str, qn: str, n: int, delay_ms: int | None = None, fail_first: bool = False) -> float:
    """Queue ``n`` jobs; returns the time (epoch s) by which all are due."""
    q = SyncQueue(qn, redis_url=url)
    try:
        for start in range(0, n, BATCH):
            items = []
            for i in range(start, min(n, start + BATCH)):
                item: dict[str, Any] = {"name": NAME, "data": {"i": i}}
                if delay_ms is not None:
                    item["delay_ms"] = delay_ms
                if fail_first:
                    item["attempts"], item["backoff"] = 2, 0
                items.append(item)
            q.add_bulk(items)
    finally:
        q.close()
    return time.time() + (delay_ms or 0) / 1000


def _event_span(url: str, qn: str, start_kind: str) -> dict[str, Any]:
    """First ``start_kind`` and last ``completed`` event times (Redis clock, ms), counts."""
    r = redis.Redis.from_url(url)
    key = QueueKeys.for_queue(qn).events
    first = last = None
    completed = 0
    cursor = "-"
    try:
        while True:
            rows = r.xrange(key, cursor, "+", count=10_000)
            if not rows:
                break
            for eid, fields in rows:
                ms = int(eid.split(b"-", 1)[0])
                kind = fields.get(b"e")
                if kind == start_kind.encode() and first is None:
                    first = ms
                if kind == b"completed":
                    completed += 1
                    last = ms
            if len(rows) < 10_000:
                break
            cursor = "(" + rows[-1][0].decode()
    finally:
        r.close()
    return {"first_ms": first, "last_ms": last, "completed_events": completed}


def _redis_cpu(url: str) -> float:
    """The server's CPU seconds so far (user + sys; includes the worker's start-up and shutdown)."""
    r = redis.Redis.from_url(url)
    try:
        info = r.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    finally:
        r.close()


def _run_worker(
    url: str, qn: str, jobs: int, handler: str, events_max: int, use_uvloop: bool, timeout: float
) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(HERE / "_engine_worker.py"),
        "--redis-url",
        url,
        "--queue",
        qn,
        "--jobs",
        str(jobs),
        "--concurrency",
        "50",
        "--handler",
        handler,
        "--events-max-len",
        str(events_max),
    ]
    if use_uvloop:
        cmd.append("--uvloop")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"worker process failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _e2e(
    url: str,
    n: int,
    *,
    tag: str,
    delay_ms: int | None = None,
    fail_first: bool = False,
    use_uvloop: bool = False,
    rate_limit: tuple[int, int] | None = None,
    concurrency: int | None = None,
) -> dict[str, Any]:
    qn = _queue_name(tag)
    try:
        due = _fill(url, qn, n, delay_ms=delay_ms, fail_first=fail_first)
        if rate_limit is not None or concurrency is not None:
            with SyncQueue(qn, redis_url=url) as q:
                if rate_limit is not None:
                    q.set_rate_limit(*rate_limit)
                q.set_concurrency(concurrency)
        wait = due - time.time() + 0.05
        if wait > 0:
            time.sleep(wait)
        deliveries = 2 * n if fail_first else n
        redis_cpu0 = _redis_cpu(url)
        worker = _run_worker(
            url,
            qn,
            deliveries,
            "fail_first" if fail_first else "noop",
            max(100_000, 8 * n),
            use_uvloop,
            timeout=120 + n / 500,
        )
        redis_cpu = _redis_cpu(url) - redis_cpu0
        span = _event_span(url, qn, "active")
        if span["first_ms"] is None or span["last_ms"] is None or span["completed_events"] < n:
            raise RuntimeError(f"{tag}: events incomplete: {span}")
        seconds = max(span["last_ms"] - span["first_ms"], 1) / 1000
        return {
            "jobs_per_s": n / seconds,
            "seconds": seconds,
            "client_cpu_us_per_job": worker["cpu_s"] / n * 1e6,
            "worker_user_us_per_job": worker["user_s"] / n * 1e6,
            "worker_sys_us_per_job": worker["sys_s"] / n * 1e6,
            "redis_cpu_us_per_job": redis_cpu / n * 1e6,
            # the worker and Redis each on a core of their own: the rate neither could exceed
            "two_core_bound_jobs_per_s": 1e6 / max(worker["cpu_s"] / n * 1e6, redis_cpu / n * 1e6, 1e-9),
            "completed_events": span["completed_events"],
            "loop": worker["loop"],
        }
    finally:
        _cleanup(url, qn)


def e2e_process(url: str, n: int) -> dict[str, Any]:
    return _e2e(url, n, tag="e2e")


def e2e_rate_unbounded(url: str, n: int) -> dict[str, Any]:
    """``e2e_process`` under a rate limit it never reaches (10**9 per second): what the
    limiter's script costs per batch (issue 24)."""
    return _e2e(url, n, tag="e2erl", rate_limit=(10**9, 1000))


def e2e_concurrency_unbounded(url: str, n: int) -> dict[str, Any]:
    """``e2e_process`` under a concurrency limit it never reaches (10**6): what the slots cost
    (the grant per batch, a ZREM per ack flush, a renewal per lease tenth; issue 24)."""
    return _e2e(url, n, tag="e2ecc", concurrency=10**6)


def e2e_process_uvloop(url: str, n: int) -> dict[str, Any]:
    return _e2e(url, n, tag="e2eu", use_uvloop=True)


def e2e_delayed(url: str, n: int) -> dict[str, Any]:
    return _e2e(url, n, tag="dly", delay_ms=1000)


def e2e_retry(url: str, n: int) -> dict[str, Any]:
    return _e2e(url, n, tag="rty", fail_first=True)


# ---- the run ----------------------------------------------------------------------------
# name -> (function, what it is, the limit its ratio is taken against)
WORKLOADS: dict[str, tuple[Callable[[str, int], dict[str, Any]], str, str | None]] = {
    "limit_sync_xadd_single": (limit_sync_xadd_single, "redis-py sync XADD, one by one (limit)", None),
    "limit_sync_xadd_pipeline": (
        limit_sync_xadd_pipeline,
        "redis-py sync pipelined XADD, 1,000 per pipeline (limit)",
        None,
    ),
    "ref_async_xadd_single": (ref_async_xadd_single, "redis.asyncio XADD, one by one (reference)", None),
    "ref_sync_lua_batch": (ref_sync_lua_batch, "EVALSHA enqueue_batch per 1,000 pre-encoded jobs (reference)", None),
    "limit_thread_handoff_16": (
        limit_thread_handoff_16,
        "16 threads passing a baton, no Redis: one blocked thread woken per step (limit)",
        None,
    ),
    "ref_redis_floor": (
        ref_redis_floor,
        "plain redis-py doing a worker's Redis commands, pipelined (Redis's floor per job)",
        None,
    ),
    "queue_add": (queue_add, "Queue.add, one by one", "ref_async_xadd_single"),
    "syncqueue_add": (syncqueue_add, "SyncQueue.add, one by one", "limit_sync_xadd_single"),
    "queue_add_bulk": (queue_add_bulk, "Queue.add_bulk, 1,000 per call", "limit_sync_xadd_pipeline"),
    "queue_add_tasks_100": (queue_add_tasks_100, "Queue.add from 100 tasks at once, one job each", "queue_add_bulk"),
    "queue_add_tasks_1000": (queue_add_tasks_1000, "Queue.add from 1,000 tasks at once", "queue_add_bulk"),
    "syncqueue_add_threads_16": (
        syncqueue_add_threads_16,
        "SyncQueue.add from 16 threads at once, one job each",
        "syncqueue_add_bulk",
    ),
    "syncqueue_add_bulk": (syncqueue_add_bulk, "SyncQueue.add_bulk, 1,000 per call", "limit_sync_xadd_pipeline"),
    "e2e_process": (e2e_process, "end to end: 1 worker process, concurrency 50, events on", "limit_sync_xadd_pipeline"),
    "e2e_process_uvloop": (e2e_process_uvloop, "end to end, same on uvloop", "limit_sync_xadd_pipeline"),
    "e2e_rate_unbounded": (
        e2e_rate_unbounded,
        "end to end under a rate limit never reached (the limiter's cost)",
        "limit_sync_xadd_pipeline",
    ),
    "e2e_concurrency_unbounded": (
        e2e_concurrency_unbounded,
        "end to end under a concurrency limit never reached (the slots' cost)",
        "limit_sync_xadd_pipeline",
    ),
    "e2e_delayed": (e2e_delayed, "delayed end to end: 1 s delay, promotion + processing", "limit_sync_xadd_pipeline"),
    "e2e_retry": (e2e_retry, "retry: every job fails once, then succeeds", "limit_sync_xadd_pipeline"),
}

# target name -> (workload, reference, goal): reference None = jobs/s at least goal; "cpu" = client
# CPU us/job at most goal; "bound" = jobs/s over its two-core bound at least goal; "floor" = Redis
# CPU per job over the floor probe's at most goal; a workload = the ratio of jobs/s at least goal
TARGETS = {
    "Queue.add >= 0.9x asyncio XADD one by one": ("queue_add", "ref_async_xadd_single", 0.9),
    "Queue.add >= 0.9x sync XADD one by one": ("queue_add", "limit_sync_xadd_single", 0.9),
    "SyncQueue.add >= 0.9x sync XADD one by one": ("syncqueue_add", "limit_sync_xadd_single", 0.9),
    "Queue.add_bulk >= 0.9x sync pipelined XADD": ("queue_add_bulk", "limit_sync_xadd_pipeline", 0.9),
    "SyncQueue.add_bulk >= 0.9x sync pipelined XADD": ("syncqueue_add_bulk", "limit_sync_xadd_pipeline", 0.9),
    "100 tasks' adds >= 0.7x Queue.add_bulk (issue 27)": ("queue_add_tasks_100", "queue_add_bulk", 0.7),
    "16 threads' adds >= 0.5x SyncQueue.add_bulk (issue 27)": ("syncqueue_add_threads_16", "syncqueue_add_bulk", 0.5),
    "e2e_process >= 0.85x its two-core bound (issue 27)": ("e2e_process", "bound", 0.85),
    "e2e_process Redis CPU <= 1.15x the floor probe (issue 27)": ("e2e_process", "floor", 1.15),
    "e2e_retry >= 0.5x e2e_process (issue 27)": ("e2e_retry", "e2e_process", 0.5),
    "end-to-end >= 50k jobs/s": ("e2e_process", None, 50_000),
    "end-to-end client CPU <= 20 us/job": ("e2e_process", "cpu", 20.0),
}


def evaluate(results: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for label, (wl, ref, goal) in TARGETS.items():
        if wl not in results:
            continue
        if ref == "cpu":
            value = results[wl].get("client_cpu_us_per_job")
            met = value is not None and value <= goal
        elif ref == "bound":
            value = results[wl]["jobs_per_s"] / results[wl]["two_core_bound_jobs_per_s"]
            met = value >= goal
        elif ref == "floor":
            if "ref_redis_floor" not in results:
                continue
            value = results[wl]["redis_cpu_us_per_job"] / results["ref_redis_floor"]["redis_cpu_us_per_job"]
            met = value <= goal
        elif ref is None:
            value = results[wl]["jobs_per_s"]
            met = value >= goal
        else:
            if ref not in results:
                continue
            value = results[wl]["jobs_per_s"] / results[ref]["jobs_per_s"]
            met = value >= goal
        out[label] = {"workload": wl, "value": value, "goal": goal, "met": met}
    return out


def table(results: dict[str, Any]) -> str:
    lines = [
        f"{'workload':<28} {'jobs/s':>10} {'ratio':>7}  {'vs':<26} {'CPU us/job':>10} {'Redis':>6}  description",
        "-" * 127,
    ]
    for name, (_fn, desc, ref) in WORKLOADS.items():
        if name not in results:
            continue
        res = results[name]
        ratio = res.get("ratio")
        cpu = res.get("client_cpu_us_per_job")
        rcpu = res.get("redis_cpu_us_per_job")
        lines.append(
            f"{name:<28} {res['jobs_per_s']:>10,.0f} {f'{ratio:.2f}x' if ratio else '':>7}  "
            f"{ref or '':<26} {f'{cpu:.1f}' if cpu is not None else '':>10} "
            f"{f'{rcpu:.1f}' if rcpu is not None else '':>6}  {desc}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=20_000, help="jobs per workload (default 20,000)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per workload; the median is reported")
    ap.add_argument("--smoke", action="store_true", help="N=500, one run: seconds, for the test suite")
    ap.add_argument("--redis-url", default=None, help="use this server instead of a private one")
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--skip", default="", help="comma-separated workload names to leave out")
    ap.add_argument("--out", default=str(RESULTS / "engine.json"))
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.repeats = 500, 1
    only = {w for w in args.only.split(",") if w}
    skip = {w for w in args.skip.split(",") if w}
    names = [w for w in WORKLOADS if (not only or w in only) and w not in skip]
    if args.n < 1 or args.repeats < 1:
        ap.error("--n and --repeats must be positive")
    try:
        import uvloop  # noqa: F401
    except ImportError:
        names = [w for w in names if w != "e2e_process_uvloop"]

    results: dict[str, Any] = {}
    meta = machine()
    with private_redis(args.redis_url) as url:
        meta.update(
            redis_version=redis_version(url),
            redis_private=args.redis_url is None,
            redis_py=redis.__version__,
            n=args.n,
            repeats=args.repeats,
            smoke=args.smoke,
            batch=BATCH,
        )
        # Interleave the repeats (A B C ... A B C ...) so a noisy neighbour hurts all alike.
        runs: dict[str, list[dict[str, Any]]] = {w: [] for w in names}
        for rep in range(args.repeats):
            for w in names:
                log(f"[{rep + 1}/{args.repeats}] {w} ...")
                res = WORKLOADS[w][0](url, args.n)
                log(f"    {res['jobs_per_s']:,.0f} jobs/s")
                runs[w].append(res)
        for w in names:
            results[w] = median_of(runs[w])
            ref = WORKLOADS[w][2]
            if ref and ref in runs:
                results[w]["ratio"] = results[w]["jobs_per_s"] / median_of(runs[ref])["jobs_per_s"]
                results[w]["ratio_to"] = ref
        if "queue_add" in results and "limit_sync_xadd_single" in results:
            results["queue_add"]["ratio_to_sync_xadd_single"] = (
                results["queue_add"]["jobs_per_s"] / results["limit_sync_xadd_single"]["jobs_per_s"]
            )
    meta["loadavg_at_end"] = os.getloadavg()
    data = {
        "meta": meta,
        "workloads": {w: WORKLOADS[w][1] for w in names},
        "results": results,
        "targets": evaluate(results),
    }
    write_json(Path(args.out), data)
    print(table(results))
    print()
    for label, t in data["targets"].items():
        print(f"target {label:<48} {'MET' if t['met'] else 'missed'} ({t['value']:,.2f})")
    print(f"\nwrote {args.out}")
    return data


if __name__ == "__main__":
    main()
