"""End to end: the example DAGs (and the sensor-cases test DAG) run with ``dag.test()``
against real Redis while real worker subprocesses drain the queues.

All runs share one ``run_dag.py`` subprocess so Airflow's start-up (config, ORM, the
in-process execution API: ~10 s on the CI machine) is paid once; each test then checks one
run's summary.  ``dag.test()`` runs deferred tasks' triggers inline, so the sensors really
go through ``ChasquiJobTrigger`` (the log shows "[DAG TEST] Trigger completed").
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from airflow_support import WorkerProcess, delete_queue_keys, run_dags

from airflow_provider_chasqui import RepeatPattern, SyncQueue

pytestmark = pytest.mark.timeout(300)

SCENARIOS = {
    "enqueue_and_wait": ("chasqui_enqueue_and_wait", "a", {}),
    "enqueue_and_wait_dlq": ("chasqui_enqueue_and_wait", "a", {"greet_job": "explode"}),
    "fan_out_100": ("chasqui_fan_out_100", "b", {"delay": 1.0}),
    "sensor_cases": ("chasqui_sensor_cases", "c", {}),
    "daily_cron_upsert": ("chasqui_daily_cron_upsert", "d", {}),
    "daily_cron_upsert_then_remove": ("chasqui_daily_cron_upsert", "e", {"remove": True}),
    "dead_letters": ("chasqui_dead_letters", "f", {}),
}


@pytest.fixture(scope="module")
def runs(airflow_home: dict[str, str], redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    queues = {tag: f"t-e2e-{tag}-{uuid.uuid4().hex[:6]}" for tag in {s[1] for s in SCENARIOS.values()}}
    logs = tmp_path_factory.mktemp("workers")
    workers = [WorkerProcess(redis_url, q, logs / f"{q}.log") for q in queues.values()]
    try:
        order = list(SCENARIOS)
        plan = [[SCENARIOS[name][0], {"queue": queues[SCENARIOS[name][1]], **SCENARIOS[name][2]}] for name in order]
        summaries = run_dags(airflow_home, plan)
        specs = {}
        for tag, queue in queues.items():
            with SyncQueue(queue, redis_url=redis_url) as q:
                specs[tag] = q.get_repeatable_job("daily-sales-report")
        yield {
            name: {**summary, "queue": plan[i][1]["queue"], "spec": specs[SCENARIOS[name][1]]}
            for i, (name, summary) in enumerate(zip(order, summaries))
        }
    finally:
        for worker in workers:
            out = worker.stop()
            assert worker.proc.returncode == 0 and "STOPPED" in out, out[-3000:]
        for q in queues.values():
            delete_queue_keys(redis_url, q)


def task_log(summary: dict, task_id: str) -> str:
    """The part of the run's log between ``[DAG TEST] starting`` and ``end task`` of one task."""
    match = re.search(
        rf"\[DAG TEST\] starting task_id={task_id} .*?\[DAG TEST\] end task task_id={task_id} ", summary["log"], re.S
    )
    assert match, f"no log for {task_id}"
    return match.group(0)


def test_enqueue_and_wait(runs: dict) -> None:
    run = runs["enqueue_and_wait"]
    assert run["state"] == "success", run["tis"]
    assert run["xcom"]["square.return_value"] == {"x": 7, "square": 49}
    assert run["xcom"]["wait_greet.return_value"] == "hello, airflow"
    assert run["xcom"]["report.return_value"] == "hello, airflow: 7^2 = 49"
    assert run["xcom"]["enqueue_greet.return_value"] == run["xcom"]["enqueue_greet.job_id"]
    assert "[DAG TEST] Trigger completed" in task_log(run, "square")  # it deferred and resumed


def test_sensor_fails_on_a_dead_lettered_job(runs: dict) -> None:
    run = runs["enqueue_and_wait_dlq"]
    assert run["state"] == "failed"
    assert run["tis"] == {
        "square": "success",
        "enqueue_greet": "success",
        "wait_greet": "failed",
        "report": "upstream_failed",
    }
    job_id = run["xcom"]["enqueue_greet.job_id"]
    assert f"Chasqui job {job_id} on queue {run['queue']} failed: unrecoverable" in task_log(run, "wait_greet")


def test_fan_out_100_jobs_one_deferred_sensor(runs: dict) -> None:
    run = runs["fan_out_100"]
    assert run["state"] == "success", run["tis"]
    results = run["xcom"]["wait_all.return_value"]
    assert list(results) == run["xcom"]["fan_out.return_value"] and len(results) == 100
    assert sorted(r["square"] for r in results.values()) == sorted(i * i for i in range(100))
    assert run["xcom"]["total.return_value"] == sum(i * i for i in range(100))
    assert "[DAG TEST] Trigger completed" in task_log(run, "wait_all")


def test_every_way_a_deferred_sensor_ends(runs: dict) -> None:
    run = runs["sensor_cases"]
    assert run["tis"] == {
        "enqueue_ok": "success",
        "enqueue_bad": "success",
        "enqueue_never": "success",
        "wait_ok": "success",
        "wait_bad": "failed",
        "wait_bad_soft": "skipped",
        "wait_timeout": "failed",
        "wait_timeout_soft": "skipped",
    }
    assert run["xcom"]["wait_ok.return_value"] == {"x": 11, "square": 121}
    for task_id in ("wait_ok", "wait_bad", "wait_timeout", "wait_timeout_soft"):
        assert "[DAG TEST] Trigger completed" in task_log(run, task_id), task_id
    assert "failed: unrecoverable" in task_log(run, "wait_bad")
    assert "AirflowSensorTimeout: Sensor has timed out after 2.0 s" in task_log(run, "wait_timeout")


def test_daily_cron_spec_is_upserted(runs: dict) -> None:
    run = runs["daily_cron_upsert"]
    assert run["tis"] == {"upsert_report": "success", "removing": "success", "remove_report": "skipped"}
    assert run["xcom"]["upsert_report.return_value"] == "daily-sales-report"
    spec = run["spec"]
    assert spec is not None and not spec.paused
    assert spec.pattern == RepeatPattern.cron("0 6 * * *", tz="America/Lima") and spec.job_name == "daily_report"
    assert spec.data == {"report": "sales", "declared_by": "chasqui_daily_cron_upsert"} and spec.attempts == 5


def test_daily_cron_spec_tear_down_run_removes_it(runs: dict) -> None:
    run = runs["daily_cron_upsert_then_remove"]
    assert run["tis"] == {"upsert_report": "success", "removing": "success", "remove_report": "success"}
    assert run["xcom"]["remove_report.return_value"] is True
    assert run["spec"] is None


def test_dead_letters_example_finds_its_job_in_the_dlq_and_removes_it(runs: dict, redis_url: str) -> None:
    run = runs["dead_letters"]
    assert run["state"] == "success", run["tis"]
    assert run["tis"] == {
        "enqueue_bad": "success",
        "wait_bad": "skipped",
        "find_in_dlq": "success",
        "settle": "success",
    }
    found = run["xcom"]["find_in_dlq.return_value"]
    job_id = run["xcom"]["enqueue_bad.job_id"]
    assert (found["job_id"], found["name"], found["reason"]) == (job_id, "explode", "unrecoverable")
    assert "explode refuses {'order': 4711}" in found["error"]
    assert run["xcom"]["settle.return_value"].startswith(f"removed 1 dead letter(s): job {job_id}")
    with SyncQueue(run["queue"], redis_url=redis_url) as q:
        assert job_id not in [row["job_id"] for row in q.peek_dlq(1000)]


WAITED = r"waited \d+\.\d\d s"


def test_task_logs_say_what_the_wait_found(runs: dict) -> None:
    """Operator, sensor and trigger log the job id, queue, state, attempts, the result (cut to a
    size) or the failure reason, and the wait: on the deferred, the fast and the failing path."""
    run, q = runs["enqueue_and_wait"], runs["enqueue_and_wait"]["queue"]
    square = task_log(run, "square")
    square_id = run["xcom"]["square.job_id"]
    assert f"queue {q}: enqueued job {square_id} (square); waiting for its result" in square
    assert re.search(
        rf"queue {q}: job {square_id} completed; waited \d+\.\d\d s; result: {{'x': 7, 'square': 49}}"
        r" \[airflow_provider_chasqui\.triggers\.job\.ChasquiJobTrigger\]",
        square,
    ), square
    assert re.search(
        rf"queue {q}: job {square_id} completed; attempts: 1; {WAITED}; result: {{'x': 7, 'square': 49}}"
        r" \[airflow\.task\.operators",
        square,
    ), square
    greet_id = run["xcom"]["enqueue_greet.job_id"]
    assert re.search(
        rf"queue {q}: job {greet_id} completed; attempts: 1; {WAITED}; result: 'hello, airflow'",
        task_log(run, "wait_greet"),
    )

    run = runs["enqueue_and_wait_dlq"]
    bad_id = run["xcom"]["enqueue_greet.job_id"]
    assert re.search(
        rf"queue {run['queue']}: job {bad_id} failed; attempts: 1; {WAITED}; reason: unrecoverable "
        r"\(handler: .*explode refuses",
        task_log(run, "wait_greet"),
    )

    run = runs["fan_out_100"]
    ids = run["xcom"]["fan_out.return_value"]
    wait_all = task_log(run, "wait_all")
    assert re.search(
        rf"queue {run['queue']}: 100 jobs \({', '.join(ids[:5])}, \.\.\.\) completed; "
        rf"attempts: 1 each; {WAITED}; results: {{'{ids[0]}': {{'x': 0, 'square': 0}}, .*\.\.\. "
        r"\[\d+ characters\]",
        wait_all,
    ), wait_all[-3000:]

    run = runs["sensor_cases"]
    assert re.search(
        rf"queue {run['queue']}: job \S+ still running at the deadline; {WAITED}", task_log(run, "wait_timeout")
    )


def test_timings_are_reported(runs: dict, record_property) -> None:
    """Not a check: the per-run ``dag.test()`` wall times, for the issue's closing note."""
    for name, run in runs.items():
        record_property(f"dag_test_seconds[{name}]", run["seconds"])
        print(f"dag.test {name}: {run['seconds']:.2f} s")
    print(f"run_dag.py process (all runs, incl. Airflow start-up): {runs['sensor_cases']['process_seconds']:.2f} s")
