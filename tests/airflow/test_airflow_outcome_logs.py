"""What the operator and the sensor log when a wait ends: the job ids, the queue, the state
found, the attempts the jobs ended on, the result (cut to a size) or the failure reason, and
how long the task waited.  Real Redis; jobs run by an in-process engine worker (retries need a
handler that fails on purpose) or by the example worker subprocess.  The ``dag.test()`` side
(deferred waits, the trigger's own line) is checked in ``test_airflow_e2e.py``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowFailException
from engine_support import running
from test_airflow_sensor import RecordingTI, _task_log

from airflow_provider_chasqui import BackoffSpec, Queue, SyncQueue, Worker
from airflow_provider_chasqui.core.outcomes import end_attempts, outcome_line
from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

WAITED = r"waited \d+\.\d\d s"


async def flaky(job: Any) -> dict[str, Any]:
    """Fails until its third run (``job.attempt`` counts the runs before this one)."""
    if job.attempt < 2:
        raise RuntimeError(f"flaky run {job.attempt + 1}")
    return {"ok": job.data["n"], "run": job.attempt + 1}


async def always_fails(job: Any) -> None:
    raise ValueError(f"bad input {job.data!r}")


HANDLERS = {"flaky": flaky, "always_fails": always_fails, "fine": lambda job: {"fine": True}}


async def _run_jobs(queue_name: str, redis_url: str) -> dict[str, str]:
    """One job of each kind, run to its end by a real worker; their ids."""
    async with Queue(queue_name, redis_url=redis_url) as q:
        fast = BackoffSpec.fixed(10)
        ids = {
            "fine": (await q.add("fine", {"n": 0})).id,
            "flaky": (await q.add("flaky", {"n": 1}, attempts=3, backoff=fast)).id,
            "bad": (await q.add("always_fails", {"n": 2}, attempts=2, backoff=fast)).id,
        }
        worker = Worker(
            queue_name, HANDLERS, redis_url=redis_url, run_scheduler=False, read_block_ms=200, store_results=True
        )
        async with running(worker):
            outcomes = await q.wait_for_results(list(ids.values()), timeout=60)
        assert set(outcomes) == set(ids.values()), outcomes
    return ids


def sensor(**kwargs: Any) -> ChasquiJobSensor:
    return ChasquiJobSensor(task_id="wait", deferrable=True, **kwargs)


@pytest.mark.timeout(120)
async def test_the_sensor_logs_attempts_results_and_failures(queue_name: str, redis_url: str) -> None:
    ids = await _run_jobs(queue_name, redis_url)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        assert q.driver.run(end_attempts(q.keys, ids.values())) == {ids["fine"]: 1, ids["flaky"]: 3, ids["bad"]: 2}

    with _task_log() as lines:
        assert sensor(job_id=ids["flaky"], queue_name=queue_name).execute({}) == {"ok": 1, "run": 3}
    assert any(
        re.fullmatch(
            rf"queue {queue_name}: job {ids['flaky']} completed; attempts: 3; {WAITED}; "
            r"result: \{'ok': 1, 'run': 3\}",
            line,
        )
        for line in lines
    ), lines

    with _task_log() as lines:
        sensor(job_id=[ids["fine"], ids["flaky"]], queue_name=queue_name).execute({})
    assert any(
        f"queue {queue_name}: 2 jobs ({ids['fine']}, {ids['flaky']}) completed; attempts: 1 to 3;" in line
        for line in lines
    ), lines

    with _task_log() as lines, pytest.raises(AirflowFailException, match="retries_exhausted"):
        sensor(job_id=ids["bad"], queue_name=queue_name).execute({})
    assert any(
        re.match(
            rf"queue {queue_name}: job {ids['bad']} failed; attempts: 2; {WAITED}; "
            r"reason: retries_exhausted \(.*bad input \{'n': 2\}",
            line,
        )
        for line in lines
    ), lines

    # resumed after a deferral: the same line from the trigger's event (attempts read again)
    event = {"status": "success", "queue": queue_name, "results": {ids["flaky"]: {"ok": 1, "run": 3}}}
    with _task_log() as lines:
        sensor(job_id=ids["flaky"], queue_name=queue_name).execute_complete({}, event)
    assert any(f"job {ids['flaky']} completed; attempts: 3;" in line for line in lines), lines


def test_the_blocking_operator_logs_what_it_waited_for(queue_name: str, start_worker) -> None:
    start_worker(queue_name)
    op = ChasquiEnqueueOperator(
        task_id="sq", job_name="square", data={"x": 12}, queue_name=queue_name, wait_for_result=True, deferrable=False
    )
    ti = RecordingTI()
    with _task_log() as lines:
        assert op.execute({"ti": ti}) == {"x": 12, "square": 144}
    job_id = ti.xcoms[("self", "job_id")]
    assert f"queue {queue_name}: enqueued job {job_id} (square); waiting for its result" in lines
    assert any(
        re.fullmatch(
            rf"queue {queue_name}: job {job_id} completed; attempts: 1; {WAITED}; "
            r"result: \{'x': 12, 'square': 144\}",
            line,
        )
        for line in lines
    ), lines

    late = ChasquiEnqueueOperator(
        task_id="late",
        job_name="square",
        data={"x": 1},
        queue_name=queue_name,
        delay=600.0,
        wait_for_result=True,
        deferrable=False,
        wait_timeout=0.3,
        wait_chunk_secs=0.1,
    )
    with _task_log() as lines, pytest.raises(Exception, match="still running"):
        late.execute({"ti": RecordingTI()})
    assert any(
        re.search(rf"queue {queue_name}: job \S+ still running at the deadline; {WAITED}", line) for line in lines
    ), lines
    late.on_kill()  # cancel the delayed job


def test_results_are_cut_to_a_size_in_the_log() -> None:
    big = {"rows": list(range(10_000))}
    line = outcome_line("q", ["j1"], "completed", attempts={"j1": 1}, waited=1.5, results={"j1": big})
    assert line.startswith("queue q: job j1 completed; attempts: 1; waited 1.50 s; result: {'rows': [0, 1, 2")
    assert line.endswith(f"... [{len(repr(big))} characters]") and len(line) < 450
    many = [f"j{i}" for i in range(8)]
    line = outcome_line("q", many, "completed", attempts={}, waited=None, results=dict.fromkeys(many, 1))
    assert "8 jobs (j0, j1, j2, j3, j4, ...) completed; attempts: unknown; results: {'j0': 1" in line
    reason = outcome_line("q", ["j"], "failed", attempts={"j": 2}, reason="x" * 5000)
    assert reason.endswith("... [5000 characters]") and len(reason) < 450
