"""Process pools (issue 25, ``engine/process_pool.py``): ``Worker(processes=N)`` and ``chasqui
worker --processes N`` run handlers in child processes.

What must hold, each tried to break: results and failures (with the child's traceback) come
back as in-process; a plain handler stuck in a loop is killed at its timeout and its process
replaced; a running pooled job is cancelled (its process killed) within 2 s, never retried nor
dead-lettered; a process that dies or swells past ``process_memory_mb`` fails only the job it
ran; a handler blocking a child stalls neither the lease renewal (no other worker takes its job
over) nor the other jobs; the pool's processes die with their worker, SIGKILL included.  Real
servers, in-process workers and ``chasqui worker`` processes; handlers in ``tests/pool_handlers.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pool_handlers
import pytest
import redis
from engine_support import running, wait_until, wait_until_sync

from airflow_provider_chasqui import ChildProcessDied, ConfigError, SyncQueue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(180)
TESTS = Path(__file__).resolve().parents[1]
ROOT = TESTS.parent


def _children(pid: int) -> list[int]:
    """The pool processes of worker ``pid`` (multiprocessing's spawn children), from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z" and b"spawn_main" in cmdline:
            found.append(int(entry))
    return sorted(found)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class CliWorker:
    """``python -m airflow_provider_chasqui.worker -H pool_handlers --processes N``, stopped by pid."""

    def __init__(self, url: str, queue: str, log: Path, *flags: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "airflow_provider_chasqui.worker", "--redis-url", url, "-q", queue]
                + ["-H", "pool_handlers", "--no-scheduler", *flags],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )

    def wait_consuming(self) -> None:
        wait_until_sync(lambda: "consuming" in self.output() or self.proc.poll() is not None, 120, what="start")
        assert self.proc.poll() is None, self.output()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        with_group = self.proc.pid
        try:
            os.killpg(with_group, signal.SIGKILL)  # whatever of its session is left
        except ProcessLookupError:
            pass
        return self.proc.returncode


@pytest.fixture
def cli_workers(tmp_path: Path) -> Iterator[list[CliWorker]]:
    made: list[CliWorker] = []
    yield made
    for worker in made:
        worker.stop()


def _pool_worker(queue: str, url: str, **kw: object) -> Worker:
    kw.setdefault("run_scheduler", False)
    kw.setdefault("read_block_ms", 500)
    kw.setdefault("store_results", True)
    kw.setdefault("processes", 2)
    return Worker(queue, pool_handlers.HANDLERS, redis_url=url, **kw)


def _pending(url: str, queue: str) -> int:
    """Entries read and not acked; 0 before the worker has made its consumer group (NOGROUP)."""
    raw = redis.Redis.from_url(url)
    try:
        return int(raw.xpending(QueueKeys.for_queue(queue).stream, "default")["pending"])
    except redis.ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        return 0
    finally:
        raw.close()


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_handlers_run_in_child_processes_and_report_as_in_process(
    redis_url: str, queue_name: str, queues, tmp_path
) -> None:
    """Plain and async handlers run in two child processes; results, a failure with the child's
    traceback, an unrecoverable error, progress (heard by the worker's listeners, refused once
    its job ended) and a batch of 100
    (one refused: 99 completed, 1 retried) come back exactly as they do in process."""
    q = queues(queue_name, redis_url)
    worker = _pool_worker(queue_name, redis_url)
    heard: list[tuple[str, str, object]] = []
    worker.on("progress", lambda job, value: heard.append((job.id, job.name, value)))
    async with running(worker):
        jobs = [await q.add("pid", i) for i in range(40)] + [await q.add("apid", 0)]
        pids = {await j.wait_for_result(timeout=60) for j in jobs}
        assert len(pids) == 2 and os.getpid() not in pids, pids

        bad = await q.add("fail", "x", attempts=1)
        failure = await wait_until(lambda: q.get_failure(bad.id), 30, what="the failure record")
        assert "ValueError" in failure.error and "bad input 'x'" in failure.error
        assert "pool_handlers.py" in failure.traceback and "in fail" in failure.traceback  # the child's frames

        fatal = await q.add("fail", "unrecoverable", attempts=5)
        failure = await wait_until(lambda: q.get_failure(fatal.id), 30, what="the unrecoverable job's record")
        assert failure.reason == "unrecoverable" and "no use retrying" in failure.error

        reporting = await q.add("report", None)
        assert await reporting.wait_for_result(timeout=30) == "reported"
        details = await q.get_job_details(reporting.id)
        assert details.progress == {"stage": "last", "pct": 90}
        assert [e["progress"] for e in details.events if e.get("e") == "progress"][-1] == '{"stage":"last","pct":90}'
        mine = [(name, value) for jid, name, value in heard if jid == reporting.id]  # the worker's listeners too
        assert mine[0] == ("report", 40) and mine[-1] == ("report", {"stage": "last", "pct": 90}), heard

        # a thread the handler left reporting: its first report after the job ended raises
        left = await q.add("leave_reporting", str(tmp_path))
        assert await left.wait_for_result(timeout=30) == "left"
        await wait_until(lambda: (tmp_path / "refused").exists(), 30, what="the left thread's report refused")
        assert f"job {left.id} attempt 1 has ended" in (tmp_path / "refused").read_text()
        assert [e["e"] for e in (await q.get_job_details(left.id)).events][-1] == "completed"

        batch = await q.add_bulk([{"name": "sums", "data": -1 if i == 37 else i, "attempts": 3} for i in range(100)])
        done = [await j.wait_for_result(timeout=60) for i, j in enumerate(batch) if i != 37]
        assert done == [i * 2 for i in range(100) if i != 37]
        refused = await q.get_job_details(batch[37].id)  # retried (attempts=3): never completed
        kinds = [e.get("e") for e in refused.events]
        assert refused.state != "completed" and "completed" not in kinds and "retry-scheduled" in kinds, refused


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_a_dead_or_swollen_child_fails_only_its_job(redis_url: str, queue_name: str, queues) -> None:
    """One child exits mid-job, another swells past ``process_memory_mb``: each fails only its
    own job (reason names the cause), the jobs queued behind it run, and the pool is whole again."""
    q = queues(queue_name, redis_url)
    worker = _pool_worker(queue_name, redis_url, process_memory_mb=200)
    async with running(worker):
        before = set(await wait_until(lambda: len(worker._procs.pids()) == 2 and worker._procs.pids(), 60))
        died = await q.add("die", 5, attempts=1)
        failure = await wait_until(lambda: q.get_failure(died.id), 30, what="the dead child's job record")
        assert "ChildProcessDied" in failure.error and "exited with code 5" in failure.error, failure
        swollen = await q.add("hog", 400, attempts=1)
        behind = [await q.add("pid", i) for i in range(10)]
        failure = await wait_until(lambda: q.get_failure(swollen.id), 60, what="the swollen child's job record")
        assert "memory limit" in failure.error and "> 200 MB" in failure.error, failure
        pids = {await j.wait_for_result(timeout=60) for j in behind}
        assert all(isinstance(p, int) and p != os.getpid() for p in pids), pids  # all ran, in children
        await wait_until(lambda: len(worker._procs.pids()) == 2, 60, what="two pool processes again")
        assert worker._procs.replaced == 2
        gone = before - set(worker._procs.pids())
        assert len(gone) == 2, (before, worker._procs.pids())
        # SIGKILL is asynchronous: a 400 MB process takes a moment to be torn down and reaped
        await wait_until(lambda: not any(_alive(pid) for pid in gone), 30, what=f"the replaced processes {gone} gone")


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_a_result_that_cannot_cross_the_pipe_fails_only_its_job(redis_url: str, queue_name: str, queues) -> None:
    """A result the child cannot pickle (a dict holding a lock, a generator) once raised inside
    the child's own reply code and ended the child, failing every job it held; one the parent
    cannot rebuild was retried as a dead child.  Each is now its own job's unrecoverable failure,
    as a result that cannot be stored is in process: no child is replaced, and the jobs sent to
    the same children beside them complete."""
    q = queues(queue_name, redis_url)
    worker = _pool_worker(queue_name, redis_url)
    async with running(worker):
        bad = [await q.add("unsendable", "dict"), await q.add("unsendable", "gen"), await q.add("unreadable", 1)]
        beside = await q.add_bulk([{"name": "pid", "data": i} for i in range(40)])
        outcomes = await q.wait_for_results([j.id for j in beside], timeout=60)
        assert len(outcomes) == 40 and {o.state for o in outcomes.values()} == {"completed"}, outcomes
        for job, says in zip(bad, ["cannot be sent", "cannot be sent", "cannot be read back"], strict=True):
            failure = await wait_until(lambda job=job: q.get_failure(job.id), 30, what=f"{job.name}'s failure record")
            assert "UnrecoverableError" in failure.error and says in failure.error, failure
            details = await q.get_job_details(job.id)
            assert details.dlq is not None and details.dlq["reason"] == "unrecoverable", details  # not retried
        assert worker._procs.replaced == 0


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_a_result_past_max_result_bytes_fails_in_its_child_before_it_crosses(
    redis_url: str, queue_name: str, queues
) -> None:
    """A pooled result packing past ``max_result_bytes`` was pickled, piped and rebuilt in the
    parent, only to be refused there.  The child now refuses it before pickling: a memoryview
    (which msgpack packs and pickle cannot) past the limit fails naming the limit, where one
    under it still fails as a value that cannot be sent; in a batch, only its job fails."""
    q = queues(queue_name, redis_url)
    limit = 50_000
    async with running(_pool_worker(queue_name, redis_url, max_result_bytes=limit)):
        big = await q.add("view", 10 * limit, attempts=3)
        small = await q.add("view", 100, attempts=3)
        batch = await q.add_bulk([{"name": "views", "data": 2 * limit if i == 4 else 0} for i in range(8)])
        outcomes = await q.wait_for_results([j.id for j in batch], timeout=60)
        big_failure = await wait_until(lambda: q.get_failure(big.id), 30, what="the big result's failure")
        small_failure = await wait_until(lambda: q.get_failure(small.id), 30, what="the small result's failure")
    assert f"packs to {10 * limit + 5:,} bytes; the limit is max_result_bytes={limit:,}" in big_failure.error
    assert "cannot be sent from its pool process" in small_failure.error, small_failure
    assert [outcomes[j.id].state for j in batch] == ["failed" if i == 4 else "completed" for i in range(8)]
    assert [outcomes[j.id].value for j in batch if j is not batch[4]] == [j.id for j in batch if j is not batch[4]]
    batch_failure = await q.get_failure(batch[4].id)
    assert f"packs to {2 * limit + 5:,} bytes" in batch_failure.error, batch_failure
    for job in (big, small, batch[4]):  # never retried
        assert (await q.get_job_details(job.id)).dlq["reason"] == "unrecoverable"


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_a_batch_jobs_exception_that_cannot_cross_fails_only_that_job(
    redis_url: str, queue_name: str, queues
) -> None:
    """A batch handler's exception instance for one job (``TwoArgs``, which pickles but cannot be
    rebuilt) made the whole reply unreadable, failing every job of the call; it now crosses as a
    ``RuntimeError`` naming it, as a raised one does, and only its job fails."""
    q = queues(queue_name, redis_url)
    async with running(_pool_worker(queue_name, redis_url)):
        jobs = await q.add_bulk([{"name": "picky_sums", "data": -1 if i == 3 else i, "attempts": 1} for i in range(10)])
        outcomes = await q.wait_for_results([j.id for j in jobs], timeout=60)
    assert [outcomes[j.id].state for j in jobs] == ["failed" if i == 3 else "completed" for i in range(10)]
    assert [outcomes[j.id].value for j in jobs if outcomes[j.id].state == "completed"] == [
        i * 2 for i in range(10) if i != 3
    ]
    failure = await q.get_failure(jobs[3].id)
    assert failure is not None and "pool_handlers.TwoArgs: refused/" in failure.error, failure


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_a_pooled_handler_exiting_or_interrupted_fails_its_job_and_the_worker_runs_on(
    redis_url: str, queue_name: str, queues
) -> None:
    """``sys.exit(0)``, ``KeyboardInterrupt`` or an async handler's own ``CancelledError`` in a
    child came back to the worker and were raised there: the exit ended the worker process
    (with code 0, so a supervisor restarting only failures left it down) and the job, never
    settled, was delivered again to the next worker.  Each now fails its own job, as in process."""
    q = queues(queue_name, redis_url)
    worker = _pool_worker(queue_name, redis_url)
    async with running(worker):
        leaving = [await q.add("leave", "0", attempts=1), await q.add("leave", "interrupt", attempts=1)]
        leaving.append(await q.add("acancelled", 1, attempts=1))
        after = await q.add_bulk([{"name": "pid", "data": i} for i in range(20)])
        outcomes = await q.wait_for_results([j.id for j in leaving + after], timeout=60)
        assert len(outcomes) == 23, outcomes
        for job, says in zip(leaving, ["SystemExit(0)", "KeyboardInterrupt()", "CancelledError()"], strict=True):
            assert outcomes[job.id].state == "failed" and outcomes[job.id].value == "retries_exhausted", outcomes[
                job.id
            ]
            failure = await wait_until(lambda job=job: q.get_failure(job.id), 30, what=f"{job.id}'s failure record")
            assert says in failure.error, failure
        assert {outcomes[j.id].state for j in after} == {"completed"}
        assert worker.is_running and worker.health()["ok"] is True, worker.health()


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_quick_jobs_never_wait_behind_a_slow_one(redis_url: str, queue_name: str, queues) -> None:
    """The pool first learns that calls are quick (a child then holds many), then one call takes
    5 s: the quick jobs queued behind it in its child are taken back and run by the other child
    within a second, none of them twice."""
    q = queues(queue_name, redis_url)
    async with running(_pool_worker(queue_name, redis_url)):
        warm = await q.add_bulk([{"name": "pid", "data": i} for i in range(500)])
        assert len({await j.wait_for_result(timeout=60) for j in warm}) >= 1
        slow = await q.add("nap", 5)
        quick = await q.add_bulk([{"name": "pid", "data": i} for i in range(200)])
        t0 = time.monotonic()
        outcomes = await q.wait_for_results([j.id for j in quick], timeout=30)
        assert time.monotonic() - t0 < 2.5, time.monotonic() - t0  # the nap takes 5 s
        pids = await q.get_job_result_bulk([j.id for j in quick])
        assert len(outcomes) == 200 and all(isinstance(p, int) for p in pids)
        slow_pid = await slow.wait_for_result(timeout=30)
        assert slow_pid not in set(pids[-50:])  # the last ones ran beside the nap, not after it
        details = [await q.get_job_details(j.id) for j in quick[:20]]
        assert all([e.get("e") for e in d.events].count("completed") == 1 for d in details)


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_pooled_jobs_waiting_behind_a_running_one_are_cancelled_before_they_start(
    redis_url: str, queue_name: str, queues
) -> None:
    """One pool process runs a job that blocks it; five jobs wait behind it (one slot sends them
    all: some held by the child, the rest by the pool).  Cancelling two of them ends each
    ``cancelled`` within 2 s while the blocker still runs (never started, never retried, no
    failure record); the other three run once the blocker is cancelled in turn."""
    q = queues(queue_name, redis_url)
    async with running(_pool_worker(queue_name, redis_url, processes=1)):
        blocker = await q.add("block", None, attempts=1)
        await wait_until(lambda: _progress(q, blocker.id), 30, what="the blocking handler to run")
        behind = [await q.add("pid", i, attempts=3) for i in range(5)]
        await wait_until(lambda: _pending(redis_url, queue_name) == 6, 30, what="all six read")
        t0 = time.monotonic()
        for job in (behind[0], behind[4]):
            assert await q.cancel(job.id) == "requested"
        for job in (behind[0], behind[4]):
            await wait_until(lambda job=job: _state_is(q, job.id, "cancelled"), 10, what="the cancel")
        assert time.monotonic() - t0 < 2.0
        assert await _progress(q, blocker.id) and await q.get_failure(blocker.id) is None  # it still runs
        assert await q.cancel(blocker.id) == "requested"
        results = [await j.wait_for_result(timeout=60) for j in behind[1:4]]
        assert all(isinstance(r, int) and r != os.getpid() for r in results), results
        for job in (behind[0], behind[4]):
            details = await q.get_job_details(job.id)
            kinds = [e.get("e") for e in details.events]
            assert details.state == "cancelled" and "completed" not in kinds and "retry-scheduled" not in kinds, kinds
            assert await q.get_failure(job.id) is None


async def _progress(q, job_id: str) -> bool:
    return (await q.get_job_details(job_id)).progress == 1


async def _state_is(q, job_id: str, state: str) -> bool:
    return await q.get_job_state(job_id) == state


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_a_pooled_handler_raising_rate_limited_runs_again_without_an_attempt(
    redis_url: str, queue_name: str, queues, tmp_path: Path
) -> None:
    """``RateLimited`` raised in a pool process sends the job back as in process: no attempt
    counted, no failure, and it runs again after the delay it named; jobs sent beside it run."""
    q = queues(queue_name, redis_url)
    async with running(_pool_worker(queue_name, redis_url)):
        others = await q.add_bulk([{"name": "pid", "data": i} for i in range(50)])
        job = await q.add("limited", str(tmp_path / "refused-once"), attempts=1)
        t0 = time.monotonic()
        assert await job.wait_for_result(timeout=30) == "ran at attempt 0"
        assert time.monotonic() - t0 >= 0.3  # the delay it asked for
        assert all(isinstance(p, int) for p in [await j.wait_for_result(timeout=30) for j in others])
        kinds = [e.get("e") for e in (await q.get_job_details(job.id)).events]
        assert "failed" not in kinds and "retry-scheduled" not in kinds and kinds.count("completed") == 1, kinds


@pytest.mark.single_node("two plain clients watch the pending entries")
async def test_pooled_jobs_out_at_the_shutdown_deadline_stay_pending_and_run_later(
    redis_url: str, queue_name: str, queues
) -> None:
    """A pool worker stopped while its one process runs an 8 s job, three more sent behind it:
    at the 1 s deadline the calls are taken back (the process killed), nothing is acked or
    failed, the four entries stay pending, and a worker started later reclaims and runs each once."""
    q = queues(queue_name, redis_url)
    worker = _pool_worker(queue_name, redis_url, processes=1, shutdown_deadline_secs=1.0, claim_min_idle_ms=1000)
    task = asyncio.ensure_future(worker.run())
    try:
        slow = await q.add("nap", 8)
        quick = [await q.add("pid", i) for i in range(3)]
        await wait_until(lambda: _pending(redis_url, queue_name) == 4, 30, what="all four read")
        await asyncio.sleep(0.2)  # the nap has started in the child (a fixed pause is safe here: any moment will do)
        t0 = time.monotonic()
        await worker.close()
        await asyncio.wait_for(task, 30)
        assert time.monotonic() - t0 < 8, "the stop waited for the nap"
    finally:
        if not task.done():
            task.cancel()
    assert _pending(redis_url, queue_name) == 4
    assert [await q.get_failure(j.id) for j in [slow, *quick]] == [None] * 4
    async with running(_pool_worker(queue_name, redis_url, processes=1, claim_min_idle_ms=1000)):
        pids = [await j.wait_for_result(timeout=60) for j in [*quick, slow]]
        assert all(isinstance(p, int) for p in pids), pids
        for job in [*quick, slow]:
            kinds = [e.get("e") for e in (await q.get_job_details(job.id)).events]
            assert kinds.count("completed") == 1, kinds


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"processes": 0}, "processes must be a positive int"),
        ({"processes": True}, "processes must be a positive int"),
        ({"processes": "2"}, "processes must be a positive int"),
        ({"processes": 2, "process_memory_mb": float("nan")}, "process_memory_mb must be a positive int"),
        ({"process_memory_mb": 100}, "needs processes=N"),
    ],
)
def test_bad_pool_options_are_refused(options: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Worker("q", pool_handlers.HANDLERS, **options)


def test_a_handler_a_child_cannot_import_is_refused() -> None:
    with pytest.raises(ConfigError, match="must be importable by name"):
        Worker("q", {"x": lambda job: job}, processes=2)

    def local(job: object) -> object:
        return job

    with pytest.raises(ConfigError, match="must be importable by name"):
        Worker("q", local, processes=1)


def test_the_child_outcome_of_a_rate_limit_and_a_timeout_crosses_the_pipe() -> None:
    """Exceptions whose ``__init__`` takes other arguments than their ``args`` pickle intact
    (the child sends them back; a ``RateLimited`` must keep its delay)."""
    import pickle

    from airflow_provider_chasqui import JobFailed, JobTimeout, RateLimited

    limited = pickle.loads(pickle.dumps(RateLimited(2500, "429 from the partner")))
    assert (limited.retry_after_ms, str(limited)) == (2500, "429 from the partner")
    timed = pickle.loads(pickle.dumps(JobTimeout(10, "j1")))
    assert (timed.timeout_ms, str(timed)) == (10, "job j1 ran past its timeout of 10 ms")
    failed = pickle.loads(pickle.dumps(JobFailed("j", "timeout", "d", traceback="tb")))
    assert (failed.job_id, failed.reason, failed.detail, failed.traceback) == ("j", "timeout", "d", "tb")
    died = pickle.loads(pickle.dumps(ChildProcessDied("gone")))
    assert str(died) == "gone"


@pytest.mark.slow  # worker processes on two servers: the main run has them, the matrix skips them
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7", "valkey8"], indirect=True)
def test_timeout_and_cancel_kill_the_pool_process_running_the_job(
    matrix_url, queue_name: str, tmp_path: Path, cli_workers: list[CliWorker]
) -> None:
    """A ``chasqui worker --processes 2``: a plain handler in an endless loop with
    ``timeout_ms=1000`` fails with reason ``timeout`` within 2 s per attempt and is retried
    per policy; a running async handler that blocks its process is cancelled within 2 s (no
    retry, no DLQ entry); each time the child running it is killed and replaced, and the
    other jobs keep running meanwhile."""
    url = matrix_url.url
    worker = CliWorker(url, queue_name, tmp_path / "pool.log", "--processes", "2", "--concurrency", "8")
    cli_workers.append(worker)
    worker.wait_consuming()
    first = _children(worker.proc.pid)
    assert len(first) == 2, first
    with SyncQueue(queue_name, redis_url=url) as q:
        spin = q.add("spin", None, timeout_ms=1000, attempts=2, backoff=100)
        t0 = time.monotonic()
        side = [q.add("pid", i) for i in range(20)]
        assert all(q.wait_for_result(j.id, timeout=60) != worker.proc.pid for j in side)  # they ran meanwhile
        failure = wait_until_sync(lambda: q.get_failure(spin.id), 30, what="the spinning job's record")
        assert failure.error.startswith("timeout:") and failure.reason == "retries_exhausted", failure
        assert time.monotonic() - t0 < 2 * 2 + 0.1 + 5  # two attempts of ~1 s, a 0.1 s backoff, slack
        assert worker.output().count("ran past its timeout") >= 2

        block = q.add("block", None, attempts=5)
        wait_until_sync(lambda: q.get_job_details(block.id).progress == 1, 30, what="the blocking handler to run")
        t1 = time.monotonic()
        assert q.cancel(block.id) == "requested"
        wait_until_sync(lambda: q.get_job_state(block.id) == "cancelled", 10, what="the cancel")
        assert time.monotonic() - t1 < 2.0
        assert q.get_failure(block.id) is None and block.id not in [r["job_id"] for r in q.peek_dlq(100)]
        after = q.add("pid", "after")
        pid_after = q.wait_for_result(after.id, timeout=60)
        now = _children(worker.proc.pid)
        assert len(now) == 2 and pid_after in now
        assert worker.output().count("starting a new one") == 3  # three kills: two timeouts and a cancel
        assert set(now) != set(first)
        old = set(first) - set(now)  # SIGKILL is asynchronous: wait for the kernel and the reaper
        wait_until_sync(lambda: not any(_alive(pid) for pid in old), 30, what=f"the replaced processes {old} gone")
        assert q.get_job_state(block.id) == "cancelled"  # never retried
    assert worker.stop() == 0, worker.output()[-3000:]
    wait_until_sync(lambda: not any(_alive(pid) for pid in now), 30, what="the pool processes to exit with it")


@pytest.mark.single_node("two plain clients watch the pending entry")
def test_a_handler_blocking_its_process_keeps_its_lease(
    redis_url: str, queue_name: str, tmp_path: Path, cli_workers: list[CliWorker]
) -> None:
    """An async handler that calls ``time.sleep`` runs for 5 leases of 1 s in a pool process: its
    worker's loop stays free, so the lease is renewed and a second worker that joins the queue
    never takes the job over (one delivery), while the pool's other process runs the queue's
    other jobs; then the job is cancelled (its process killed)."""
    pooled = CliWorker(redis_url, queue_name, tmp_path / "a.log", "--processes", "2", "--claim-min-idle-ms", "1000")
    cli_workers.append(pooled)
    pooled.wait_consuming()
    keys = QueueKeys.for_queue(queue_name)
    raw = redis.Redis.from_url(redis_url)
    try:
        with SyncQueue(queue_name, redis_url=redis_url) as q:
            block = q.add("block", None, attempts=1)
            wait_until_sync(lambda: q.get_job_details(block.id).progress == 1, 30, what="the blocking handler to run")
            other = CliWorker(redis_url, queue_name, tmp_path / "b.log", "--claim-min-idle-ms", "1000")
            cli_workers.append(other)
            other.wait_consuming()
            mine = f"-{pooled.proc.pid}-"
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                oldest = raw.xpending_range(keys.stream, "default", "-", "+", 1)  # the blocking job's entry
                assert oldest[0]["times_delivered"] == 1 and mine in oldest[0]["consumer"].decode(), oldest
                side = q.add("pid", 1)
                assert q.wait_for_result(side.id, timeout=30) > 0
            assert q.cancel(block.id) == "requested"
            wait_until_sync(lambda: q.get_job_state(block.id) == "cancelled", 10, what="the cancel")
    finally:
        raw.close()
    assert "lease lost" not in pooled.output() + other.output()


def test_pool_processes_die_with_their_worker(redis_url: str, queue_name: str, tmp_path: Path, cli_workers) -> None:
    """SIGTERM: the worker drains and its pool processes exit; SIGKILL of the worker while a
    child spins: the children die too (PR_SET_PDEATHSIG), none is left running a handler."""
    worker = CliWorker(redis_url, queue_name, tmp_path / "term.log", "--processes", "2")
    cli_workers.append(worker)
    worker.wait_consuming()
    children = _children(worker.proc.pid)
    assert len(children) == 2
    assert worker.stop() == 0, worker.output()[-3000:]
    wait_until_sync(lambda: not any(_alive(p) for p in children), 10, what="the children to exit")

    killed = CliWorker(redis_url, queue_name, tmp_path / "kill.log", "--processes", "2")
    cli_workers.append(killed)
    killed.wait_consuming()
    children = _children(killed.proc.pid)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        spin = q.add("spin", None)
        wait_until_sync(lambda: q.get_job_details(spin.id).state == "active", 30, what="the spin to run")
    os.kill(killed.proc.pid, signal.SIGKILL)
    killed.proc.wait(10)
    wait_until_sync(lambda: not any(_alive(p) for p in children), 10, what="the orphans to die")


@pytest.mark.single_node("the pool does not depend on the server's topology")
async def test_a_script_without_a_main_guard_gets_a_clear_error(
    tmp_path: Path, redis_url: str, queue_name: str
) -> None:
    """Spawned children import the main script: one that starts a worker at import time
    without ``if __name__ == "__main__":`` gets a ConfigError that says so."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import asyncio, pool_handlers\n"
        "from airflow_provider_chasqui import Worker\n"
        f"w = Worker({queue_name!r}, pool_handlers.HANDLERS, redis_url={redis_url!r}, processes=1, max_jobs=1)\n"
        "asyncio.run(w.run())\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(script), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode != 0
    assert b'if __name__ == "__main__":' in out, out[-3000:]
