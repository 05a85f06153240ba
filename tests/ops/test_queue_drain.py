"""``Queue.drain`` / ``obliterate`` (and their ``chasqui queue`` commands) on Redis 7.0 and
Valkey 8.1: what goes, what stays (running jobs, jobs added meanwhile), the refusal while
workers are active, and every key gone after an obliterate."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from servers import RunningServer

from airflow_provider_chasqui import Queue, RepeatPattern, SyncQueue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.maintenance import QueueInUse, drain, obliterate
from airflow_provider_chasqui.errors import NotSupportedError
from airflow_provider_chasqui.examples.handlers import HANDLERS
from airflow_provider_chasqui.sync.queue import list_queues

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["redis7", "valkey8"])
def url(request: pytest.FixtureRequest, _server_pool: Callable[[str], RunningServer]) -> str:
    return _server_pool(request.param).url


@pytest.fixture
def q_name(url: str) -> Iterator[str]:
    name = f"t-drain-{uuid.uuid4().hex[:8]}"
    yield name
    with redis.Redis.from_url(url) as r:
        for key in r.scan_iter(match="{chasqui:" + name + "}*"):
            r.delete(key)


def _keys(r: redis.Redis, queue: str) -> list[bytes]:
    return sorted(r.scan_iter(match="{chasqui:" + queue + "}*", count=1000))


def test_drain_deletes_waiting_and_delayed_jobs_and_keeps_running_ones(url: str, q_name: str) -> None:
    k = QueueKeys.for_queue(q_name)
    with SyncQueue(q_name, redis_url=url) as q, redis.Redis.from_url(url) as r:
        for i in range(10):
            q.add("send", i)
        r.xgroup_create(k.stream, "default", id="0")
        running = [e for _s, rows in r.xreadgroup("default", "c-1", {k.stream: ">"}, count=3) for e, _f in rows]
        q.add("later", 1, delay=60_000)
        q.add("later", 2, delay=60_000, job_id="kept-id")
        r.xadd(k.dlq, {"d": b"", "reason": "malformed"})
        q.upsert_repeatable_job("beat", 1, repeat=RepeatPattern.every(60_000))
        q.add_bulk([{"name": "urgent", "data": i, "priority": 1 + i % 3} for i in range(4)])  # waiting too
        q.add_bulk([{"name": "tenant", "data": i, "group": f"t{i % 2}"} for i in range(5)])  # and these

        report = q.drain()
        assert (report.waiting, report.delayed) == (7 + 4 + 5, 2)
        assert r.zcard(k.prioritized) == 0 and r.zcard(k.groups) == 0 and not r.exists(k.group_jobs("t0"))
        assert [e for e, _f in r.xrange(k.stream)] == running  # only the delivered entries stay
        assert r.xpending(k.stream, "default")["pending"] == 3
        assert r.zcard(k.delayed) == 0 and not r.exists(k.didx("kept-id"), k.dlid("kept-id"))
        assert r.xlen(k.dlq) == 1 and r.zcard(k.repeat) == 1  # DLQ and specs are not jobs to drain
        assert not [key for key in _keys(r, q_name) if b":draining:" in key]  # the set moved aside is gone
        assert q.cancel_delayed("kept-id") is False
        q.add("later", 3, delay=60_000, job_id="kept-id")  # the id may be used again, as after a cancel
        assert r.zcard(k.delayed) == 1
        fresh = q.add("send", "after")
        assert r.xreadgroup("default", "c-2", {k.stream: ">"})[0][1][0][1][b"d"]  # workers go on reading
        assert q.get_job_details(fresh.id).state == "active"

        q.add("late", 1, delay=60_000)
        assert (q.drain(delayed=False).delayed, r.zcard(k.delayed)) == (0, 2)


def test_drain_beside_a_running_producer(url: str, q_name: str) -> None:
    k = QueueKeys.for_queue(q_name)
    with SyncQueue(q_name, redis_url=url) as q, redis.Redis.from_url(url) as r:
        q.add_bulk([{"name": "early", "data": i} for i in range(5000)])
        q.add_bulk([{"name": "early", "data": i, "delay": 60_000} for i in range(2000)])
        stop = threading.Event()
        after: list[str] = []
        drained = threading.Event()

        def produce() -> None:
            with SyncQueue(q_name, redis_url=url) as p:
                while not stop.is_set():
                    job = p.add("late", 1)
                    delayed = p.add("late", 2, delay=60_000)
                    if drained.is_set():
                        after.extend((job.id, delayed.id))

        t = threading.Thread(target=produce)
        t.start()
        try:
            report = q.driver.run(drain(q_name, chunk=100))  # many small steps, the producer in between
            drained.set()
            while len(after) < 20:
                assert t.is_alive()
                stop.wait(0.01)
        finally:
            stop.set()
            t.join(30)
        assert report.waiting >= 5000 and report.delayed >= 2000
        names = {f[b"n"] for _e, f in r.xrange(k.stream)}
        assert names == {b"late"}  # every early job went; late ones may have, if added before the start
        left = {d.id for d in (q.get_job_details(j) for j in after) if d.state in ("waiting", "delayed")}
        assert left == set(after)  # every job added after the drain returned is there


def test_obliterate_refuses_while_a_worker_runs_then_deletes_every_key(url: str, q_name: str) -> None:
    async def scenario() -> None:
        async with Queue(q_name, redis_url=url) as q:
            ok = await q.add("square", {"x": 2})
            await q.add("explode", {"x": 3})
            worker = Worker(q_name, HANDLERS, redis_url=url, store_results=True)
            running = asyncio.create_task(worker.run())
            try:
                for _ in range(3000):
                    if await q.get_job_state(ok.id) == "completed" and worker.processed >= 2:
                        break
                    await asyncio.sleep(0.02)
                assert await q.get_job_result(ok.id) == {"x": 2, "square": 4}
                await q.add("later", 1, delay=60_000, job_id="d-1")
                await q.add_unique("greet", 1, key="u-1", delay=60_000)
                await q.upsert_repeatable_job("beat", 1, repeat=RepeatPattern.every(60_000))
                with redis.Redis.from_url(url) as r:
                    before = _keys(r, q_name)
                    with pytest.raises(QueueInUse, match="in use"):  # its promoter's lock, its consumer
                        await q.obliterate()
                    assert _keys(r, q_name) == before  # refused: nothing deleted
            finally:
                await worker.close()
                await asyncio.wait_for(running, 60)
            with redis.Redis.from_url(url) as r:  # a worker that stopped cleanly left no consumer behind
                assert r.exists(q.keys.result(ok.id)) and r.zcard(q.keys.failures) == 1
                await q.add("urgent", 1, priority=2)  # a prioritized job waiting: its set goes too
                await q.add("tenant", 1, group="t")  # a grouped one: the turn and the group's list go too
                assert r.zcard(q.keys.prioritized) == 1 and r.llen(q.keys.group_jobs("t")) == 1
                report = await q.obliterate()
                assert report.indexed >= 5 and report.swept is not None  # result, failure, delayed, 2 specs
                assert _keys(r, q_name) == []

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_obliterate_refuses_while_jobs_are_pending(url: str, q_name: str) -> None:
    k = QueueKeys.for_queue(q_name)
    with SyncQueue(q_name, redis_url=url) as q, redis.Redis.from_url(url) as r:
        q.add("send", 1)
        r.xgroup_create(k.stream, "default", id="0")
        r.xreadgroup("default", "c-1", {k.stream: ">"})
        with pytest.raises(QueueInUse, match="1 pending"):
            q.driver.run(obliterate(q_name, active_window_ms=0))
        r.set(k.promoter_lock, "p-live")
        with pytest.raises(QueueInUse, match="promoter"):
            q.obliterate()
        assert q.obliterate(force=True).keys >= 2 and _keys(r, q_name) == []


def _cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
        env=env,
    )


def test_queue_drain_and_obliterate_commands(url: str, q_name: str) -> None:
    k = QueueKeys.for_queue(q_name)
    with SyncQueue(q_name, redis_url=url) as q, redis.Redis.from_url(url) as r:
        for i in range(4):
            q.add("send", i)
        q.add("later", 1, delay=60_000)
        refused = _cli("queue", "drain", q_name, "--redis-url", url)
        assert refused.returncode == 2 and "--yes" in refused.stderr and r.xlen(k.stream) == 4
        done = _cli("queue", "drain", q_name, "--yes", "--json", "--redis-url", url)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"queue": q_name, "waiting": 4, "delayed": 1}
        q.add("send", 9)
        r.xgroup_create(k.stream, "default", id="0")
        r.xreadgroup("default", "c-1", {k.stream: ">"})
        busy = _cli("queue", "obliterate", q_name, "--yes", "--redis-url", url)
        assert busy.returncode == 1 and "in use" in busy.stderr and r.xlen(k.stream) == 1
        gone = _cli("queue", "obliterate", q_name, "--yes", "--force", "--redis-url", url)
        assert gone.returncode == 0, gone.stderr
        assert gone.stdout.startswith(f"obliterated {q_name}:") and _keys(r, q_name) == []


def test_queue_clean_and_job_remove_commands(url: str, q_name: str) -> None:
    k = QueueKeys.for_queue(q_name)
    with SyncQueue(q_name, redis_url=url) as q, redis.Redis.from_url(url) as r:
        ids = [q.add("send", i).id for i in range(4)]
        later = q.add("later", 1, delay=60_000)
        refused = _cli("queue", "clean", q_name, "--state", "waiting", "--redis-url", url)
        assert refused.returncode == 2 and "--yes" in refused.stderr and r.xlen(k.stream) == 4
        bad = _cli("queue", "clean", q_name, "--state", "active", "--yes", "--redis-url", url)
        assert bad.returncode == 2 and "invalid choice: 'active'" in bad.stderr
        young = _cli(
            "queue", "clean", q_name, "--state", "waiting", "--grace-ms", "3600000", "--yes", "--redis-url", url
        )
        assert young.returncode == 0 and "0 waiting jobs deleted" in young.stdout and r.xlen(k.stream) == 4
        done = _cli(
            "queue", "clean", q_name, "--state", "waiting", "--limit", "3", "--yes", "--json", "--redis-url", url
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout) == {"queue": q_name, "state": "waiting", "removed": ids[:3]}
        gone = _cli("job", "remove", later.id, "-q", q_name, "--yes", "--redis-url", url)
        assert gone.returncode == 0 and gone.stdout == f"job {later.id}: removed from delayed\n", gone.stderr
        again = _cli("job", "remove", later.id, "-q", q_name, "--yes", "--json", "--redis-url", url)
        assert json.loads(again.stdout) == {
            "job_id": later.id,
            "queue": q_name,
            "delayed": False,
            "stream": False,
            "dlq": False,
            "result": False,
        }
        assert q.get_job_counts("waiting", "delayed") == {"waiting": 1, "delayed": 0}


def test_drain_obliterate_and_job_details_on_a_cluster(cluster_server, queue_name: str) -> None:
    """Every script call stays in the queue's hash slot; only the final SCAN sweep and the
    queue listing (no SCAN spans the nodes) are left out there."""
    url = cluster_server.url
    with SyncQueue(queue_name, redis_url=url) as q:
        jobs = [q.add("send", i) for i in range(5)]
        q.add("later", 1, delay=60_000, job_id="c-1")
        assert q.get_job_details(jobs[2].id).state == "waiting"
        assert q.get_job_details("c-1").state == "delayed"
        assert q.drain().to_dict() == {"waiting": 5, "delayed": 1}
        q.add("send", "again")
        q.upsert_repeatable_job("beat", 1, repeat=RepeatPattern.every(60_000))
        report = q.obliterate()
        assert report.swept is None and report.indexed == 1
        with pytest.raises(NotSupportedError):
            list_queues(q.driver)
        node = q.driver.client.get_node_from_key(q.keys.prefix)
        with redis.Redis(host=node.host, port=node.port) as r:  # the node holding the queue's slot
            assert list(r.scan_iter(match="{chasqui:" + queue_name + "}*")) == []
