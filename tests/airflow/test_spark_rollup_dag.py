"""``example_dags/spark_events_rollup.py`` under ``dag.test()``: Spark (``local[2]``, in the task
process) writes one job per CSV row through ``format("chasqui")``, a real worker subprocess
(``worker_main.py``, the example handlers) runs them, one deliberately bad row is dead-lettered,
and a Structured Streaming query over the events stream writes the per-minute rollup that the
DAG's last task checks.  The test reads that Parquet itself (pyarrow) and checks the queue.
A second run, on a queue no worker serves, must fail in ``check_rollup`` and say why.

Both runs share their own ``run_dag.py`` process (the Spark JVM of its tasks stays out of the
other end-to-end runs).
"""

from __future__ import annotations

import re
import sys
import uuid
from collections.abc import Iterator

import pytest
from airflow_support import WorkerProcess, delete_queue_keys, run_dags

from airflow_provider_chasqui import SyncQueue

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.timeout(600),
]  # the tasks start Spark JVMs

DAG_ID = "chasqui_spark_events_rollup"
TASKS = ("generate_orders", "enqueue_rows", "rollup_events", "check_rollup")
ROWS, BAD = 200, 1
UNSERVED_ROWS = 20


@pytest.fixture(scope="module")
def runs(
    airflow_home: dict[str, str],
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict]:
    tmp = tmp_path_factory.mktemp("rollup")
    queues = {
        "served": f"t-e2e-rollup-{uuid.uuid4().hex[:6]}",
        "unserved": f"t-e2e-rollup-none-{uuid.uuid4().hex[:6]}",
    }
    env = {
        **airflow_home,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    worker = WorkerProcess(redis_url, queues["served"], tmp / "worker.log")
    try:
        served, unserved = run_dags(
            env,
            [
                [
                    DAG_ID,
                    {
                        "queue": queues["served"],
                        "data_dir": str(tmp / "data"),
                        "rows": ROWS,
                        "bad_rows": BAD,
                        "wait_timeout_s": 240,
                    },
                ],
                [
                    DAG_ID,
                    {
                        "queue": queues["unserved"],
                        "data_dir": str(tmp / "data"),
                        "rows": UNSERVED_ROWS,
                        "bad_rows": 0,
                        "wait_timeout_s": 3,
                    },
                ],
            ],
            timeout=540,
        )
        with SyncQueue(queues["served"], redis_url=redis_url) as q:
            load_id = served["xcom"]["enqueue_rows.return_value"]["load_id"]
            dlq = [r for r in q.peek_dlq(100) if r["job_id"].startswith(load_id + "-")]
            results = q.get_job_result_bulk([f"{load_id}-0-{i}" for i in range(ROWS)])
        yield {
            "served": {**served, "dlq": dlq, "results": results},
            "unserved": unserved,
        }
    finally:
        out = worker.stop()
        for queue in queues.values():
            delete_queue_keys(redis_url, queue)
    assert worker.proc.returncode == 0 and "STOPPED" in out, out[-3000:]


def test_rows_become_jobs_and_the_streamed_rollup_counts_every_outcome(
    runs: dict,
) -> None:
    import pyarrow.parquet as pq

    run = runs["served"]
    assert run["state"] == "success", (run["tis"], run["log"][-6000:])
    assert run["tis"] == dict.fromkeys(TASKS, "success")
    dataset, load = (
        run["xcom"]["generate_orders.return_value"],
        run["xcom"]["enqueue_rows.return_value"],
    )
    assert (load["rows"], load["added"], load["skipped"]) == (ROWS, ROWS, 0)
    assert load["load_id"] == dataset["load_id"] and dataset["bad_order_ids"] == [0]

    # the rollup, read here with pyarrow: every row's job has exactly one outcome
    rollup = run["xcom"]["rollup_events.return_value"]
    table = pq.read_table(rollup["output"])
    assert {"minute", "completed", "failed", "failed_attempts", "batch_id"} <= set(table.column_names)
    completed, failed = (
        sum(table.column("completed").to_pylist()),
        sum(table.column("failed").to_pylist()),
    )
    assert (completed, failed) == (ROWS - BAD, BAD)
    assert sum(table.column("failed_attempts").to_pylist()) == BAD  # refused for good: no retry
    assert all(m.second == 0 and m.microsecond == 0 for m in table.column("minute").to_pylist())
    checked = run["xcom"]["check_rollup.return_value"]
    assert (checked["rows"], checked["completed"], checked["failed"]) == (
        ROWS,
        ROWS - BAD,
        BAD,
    )
    assert checked["rollup_rows"] == table.num_rows == rollup["rollup_rows"]
    assert f"rollup run {rollup['query_runs']}: {ROWS} of {ROWS} jobs have an outcome" in run["log"]
    # the events source supports availableNow: no fallback to one batch
    assert "does not support Trigger.AvailableNow" not in run["log"]

    # ... and the queue agrees: deterministic ids <load_id>-<partition>-<row> (one partition, in
    # file order), the bad order (order 0, the first row) dead-lettered, the others' results stored
    assert [r["job_id"] for r in run["dlq"]] == [f"{load['load_id']}-0-0"], run["dlq"]
    assert "score_order refuses order 0: negative amount" in run["dlq"][0]["error"]
    assert run["results"][0] is None
    assert [r["order_id"] for r in run["results"][BAD:]] == list(range(BAD, ROWS))
    print(
        f"dag.test {DAG_ID}: {run['seconds']:.2f} s, {rollup['query_runs']} availableNow run(s) of the rollup "
        f"query, {table.num_rows} rollup row(s); run_dag.py process (both runs): {run['process_seconds']:.2f} s"
    )


def test_check_rollup_fails_and_says_why_when_no_worker_serves_the_queue(
    runs: dict,
) -> None:
    run = runs["unserved"]
    assert run["state"] == "failed"
    assert run["tis"] == {
        "generate_orders": "success",
        "enqueue_rows": "success",
        "rollup_events": "success",
        "check_rollup": "failed",
    }
    assert run["xcom"]["enqueue_rows.return_value"]["added"] == UNSERVED_ROWS
    assert re.search(
        rf"counts 0 completed \+ 0 failed = 0 jobs, but {UNSERVED_ROWS} rows were written \(load "
        r"orders-\S+\): is a worker running on the queue with the example handlers\?",
        run["log"],
    ), run["log"][-4000:]
