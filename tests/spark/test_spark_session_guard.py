"""A handler that stops the Spark worker's shared session (``spark.stop()``, as a script ends)
must not take the queue down with it.

Before, every later Spark job of that worker failed on the stopped context (each retried and
dead-lettered in turn) and the worker ended in a traceback.  Now the job that stopped it fails
as unrecoverable (run again, it would stop the next worker's session too), the worker stops
reading at once and exits 1, and the jobs it had not run stay in the queue for a worker with a
live session (one it had read ahead fails once and follows its retry policy, as when the JVM
dies).  A real worker process (``python -m airflow_provider_chasqui.worker.spark``) on
``local[1]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_chasqui import SyncQueue

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.mark.timeout(600)
def test_a_handler_stopping_the_session_stops_the_worker_and_no_other_job_is_lost(
    redis_url: str, queue_name: str
) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        first = q.add("spark_count", {"n": 10}, attempts=1)
        stopper = q.add("spark_stop_session", {}, attempts=3)
        later = [q.add("spark_count", {"n": 100 + i}, attempts=2) for i in range(4)]
        env = dict(
            os.environ,
            SPARK_LOCAL_IP="127.0.0.1",
            PYSPARK_PYTHON=sys.executable,
            PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        )
        proc = subprocess.run(
            [sys.executable, "-m", "airflow_provider_chasqui.worker.spark", "--queue", queue_name]
            + ["--redis-url", redis_url, "--handlers", "spark_test_handlers", "--concurrency", "1"]
            + ["--prefetch", "1", "--store-results", "--no-scheduler", "--idle-exit", "30"]
            + ["--spark-conf", "spark.master=local[1]", "--spark-conf", "spark.ui.enabled=false"],
            env=env,
            capture_output=True,
            text=True,
            timeout=500,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out[-4000:]
        assert not any(line.startswith("Traceback") for line in out.splitlines()), out[-4000:]  # no crash
        assert "stopped the worker's shared SparkSession" in out, out[-4000:]
        assert q.get_job_result(first.id) == {"count": 10, "master": "local[1]"}
        failure = q.get_failure(stopper.id)
        assert failure is not None and failure.reason == "unrecoverable", failure  # not run again (attempts=3)
        assert "spark.stop()" in failure.error
        # none of the later jobs was dead-lettered: each still waits for a worker with a live session
        dead = {row["job_id"] for row in q.peek_dlq(20)}
        assert dead == {stopper.id}, dead
        states = [q.get_job_state(j.id) for j in later]  # waiting, or delayed once (read ahead)
        assert "failed" not in states and "completed" not in states, states
