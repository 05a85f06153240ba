"""Progress (issue 25, ``core/running.py``, ``engine/progress.py``): a handler reports with
``await job.update_progress(value)`` (``update_progress_sync`` from a thread); the worker keeps
the latest value with the job and emits ``progress`` events, coalesced to at most one write per
job every ``PROGRESS_FLUSH_SECS``.  Real servers and workers; the CLI as a subprocess."""

from __future__ import annotations

import asyncio
import functools
import json
import math
import subprocess
import sys
import time

import pytest
import redis
from engine_support import events_of, raw_sync, running, wait_until

from airflow_provider_chasqui import ConfigError
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.running import MAX_PROGRESS_BYTES, check_progress, parse_progress

pytestmark = pytest.mark.timeout(120)


async def test_progress_reaches_the_job_the_events_and_the_cli(
    redis_url: str, queue_name: str, queues, worker_factory, clients
) -> None:
    """A handler reports 10,000 times over about a second, then a dict: the job keeps the last
    value, the events hold a handful of coalesced ``progress`` entries (not 10,001) ending with
    the dict, and ``chasqui job show`` prints it."""
    q = queues(queue_name, redis_url)
    reported = asyncio.Event()

    async def h(job):
        t0 = time.monotonic()
        for i in range(10_000):
            await job.update_progress(i / 100)
            if i % 1000 == 0:
                await asyncio.sleep(0.1)
        await job.update_progress({"stage": "upload", "done": 3, "of": 4})
        await asyncio.sleep(0.6)  # the last value is written within PROGRESS_FLUSH_SECS
        reported.set()
        await asyncio.sleep(0.5)
        return time.monotonic() - t0

    async with running(worker_factory(queue_name, h, redis_url, store_results=True)):
        job = await q.add("p", {})
        await wait_until(reported.is_set, 30, what="the handler's reports")
        details = await q.get_job_details(job.id)
        assert details.progress == {"stage": "upload", "done": 3, "of": 4}
        elapsed = await job.wait_for_result(timeout=30)
    events = [e for e in await events_of(clients(redis_url), queue_name) if e["e"] == "progress"]
    assert events and json.loads(events[-1]["progress"]) == {"stage": "upload", "done": 3, "of": 4}
    assert all(e["id"] == job.id for e in events)
    assert 2 <= len(events) <= elapsed / 0.25 + 3, len(events)  # coalesced: ~4 writes a second at most
    if "cluster" not in redis_url:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "airflow_provider_chasqui.cli",
                "job",
                "show",
                job.id,
                "--queue",
                queue_name,
                "--redis-url",
                redis_url,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "progress" in out.stdout and '"stage": "upload"' in out.stdout, out.stdout


async def test_a_thread_handler_reports_progress(redis_url: str, queue_name: str, queues, worker_factory) -> None:
    q = queues(queue_name, redis_url)

    def h(job):
        job.update_progress_sync(42)
        time.sleep(0.6)
        return "done"

    async with running(worker_factory(queue_name, h, redis_url, store_results=True)):
        job = await q.add("p", {})
        assert await job.wait_for_result(timeout=30) == "done"
        assert (await q.get_job_details(job.id)).progress == 42


async def _two_reports(job):
    await job.update_progress({"step": 1})
    await job.update_progress({"step": 2, "i": job.data["i"]})
    return job.data["i"]


def _two_reports_in_a_thread(job):
    job.update_progress_sync({"step": 1})
    job.update_progress_sync({"step": 2, "i": job.data["i"]})
    return job.data["i"]


TWO_REPORTS = {"a": _two_reports, "t": _two_reports_in_a_thread}  # report twice, return at once


async def test_a_jobs_last_report_is_written_before_its_outcome(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """Handlers (async and in a thread) report and return at once, 40 jobs: whoever sees a
    job's result sees its last report, never an earlier one or none (the worker's flusher
    writes pending progress before the outcomes, not up to ``PROGRESS_FLUSH_SECS`` later)."""
    q = queues(queue_name, redis_url)

    w = worker_factory(queue_name, TWO_REPORTS, redis_url, store_results=True, concurrency=8)
    async with running(w):
        jobs = [await q.add("a" if i % 2 else "t", {"i": i}) for i in range(40)]
        for job in jobs:
            i = await job.wait_for_result(timeout=30)
            assert (await q.get_job_details(job.id)).progress == {"step": 2, "i": i}, job.id


async def test_the_last_reports_of_jobs_ending_together_are_written_before_their_outcomes(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    """600 jobs at once, half in threads, each reporting twice and ending at once: jobs start,
    report and end while the flusher writes earlier outcomes, so every batch of outcomes
    must wait for the reports (and ``active`` events) of its own jobs, not only those pending
    when the pass began.  Each job's stored progress is its last report."""
    q = queues(queue_name, redis_url)

    w = worker_factory(queue_name, TWO_REPORTS, redis_url, store_results=True, concurrency=32)
    n = 600
    async with running(w):
        jobs = await q.add_bulk([{"name": "a" if i % 2 else "t", "data": {"i": i}} for i in range(n)])
        outcomes = await q.wait_for_results([j.id for j in jobs], timeout=60)
        assert len(outcomes) == n
    r = raw_sync(redis_url)
    try:
        events = r.xrange(QueueKeys.for_queue(queue_name).events)
    finally:
        r.close()
    last_report: dict[str, dict[str, object]] = {}
    active: set[str] = set()
    late = []  # jobs whose outcome is in the events stream before their `active` event or last report
    for _eid, fields in events:
        kind, jid = fields[b"e"].decode(), fields[b"id"].decode()
        if kind == "active":
            active.add(jid)
        elif kind == "progress":
            last_report[jid] = json.loads(fields[b"progress"])
        elif kind == "completed" and (jid not in active or last_report.get(jid, {}).get("step") != 2):
            late.append((jid, jid in active, last_report.get(jid)))
    assert late == [], f"{len(late)} of {n} jobs' outcomes were written before their last report: {late[:5]}"
    assert sorted(last_report) == sorted(j.id for j in jobs)


@pytest.mark.parametrize(
    "bad",
    [
        math.nan,
        math.inf,
        True,
        "50%",
        [1, 2],
        None,
        {"x": "y" * MAX_PROGRESS_BYTES},
        {"o": object()},
        {(1, 2): 3},  # msgpack packed it; its event's JSON did not, and every flush lost the report
        {"done": [1, math.nan]},
        10**400,
        {"k": "\udcff"},
        functools.reduce(lambda inner, _: {"a": inner}, range(5000), {}),  # was a bare RecursionError
    ],
)
def test_a_bad_progress_value_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="progress"):
        check_progress(bad)


async def test_a_handler_reporting_bad_progress_fails_with_the_reason(
    redis_url: str, queue_name: str, queues, worker_factory
) -> None:
    q = queues(queue_name, redis_url)

    async def h(job):
        await job.update_progress(math.nan)

    async with running(worker_factory(queue_name, h, redis_url, store_results=True)):
        job = await q.add("p", {}, attempts=1)
        failure = await wait_until(lambda: q.get_failure(job.id), 30, what="the job to fail")
    assert "progress must be finite" in failure.error
    with pytest.raises(RuntimeError, match="inside a worker"):
        await job.update_progress(1)  # a producer's Job has no worker to report to


@pytest.mark.single_node("writes hostile values with a plain client")
async def test_hostile_stored_progress_reads_as_none(redis_url: str, queue_name: str, queues) -> None:
    keys = QueueKeys.for_queue(queue_name)
    q = queues(queue_name, redis_url)
    job = await q.add("p", {}, delay_ms=3_600_000)
    admin = redis.asyncio.Redis.from_url(redis_url)
    try:
        for junk in (b"\xc1", b"\xa3abc", b"\xc3", b"x" * 5000):
            await admin.set(keys.progress(job.id), junk)
            assert (await q.get_job_details(job.id)).progress is None
    finally:
        await admin.aclose()
    assert parse_progress(b"\x92\x01\x02") is None and parse_progress(b"\x05") == 5
