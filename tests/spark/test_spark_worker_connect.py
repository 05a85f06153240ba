"""The Spark worker over Spark Connect: ``--remote sc://...`` (or ``$SPARK_REMOTE``) builds a
Connect client session against the test server (``spark_connect_url``); handlers get it, their
operations carry the tag ``chasqui-<job id>``, and the JVM-only parts are skipped with a log line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_chasqui import SyncQueue

pytestmark = pytest.mark.timeout(900)  # the first test in a run pays for starting the Connect server

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("SPARK_CONNECT", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"))
    }
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(HERE), str(ROOT), os.environ.get("PYTHONPATH")) if p),
        **extra,
    )
    return env


def _worker(queue: str, redis_url: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_provider_chasqui.worker.spark",
            "-q",
            queue,
            "--redis-url",
            redis_url,
            "-H",
            "spark_test_handlers:spark_connect_count",
            "--max-jobs",
            "1",
            "--no-scheduler",
            *args,
        ],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("how", ["--remote", "SPARK_REMOTE"])
def test_spark_worker_runs_handlers_over_spark_connect(
    spark_connect_url: str, redis_url: str, queue_name: str, how: str
) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("spark_connect_count", {"n": 4321})
        if how == "--remote":
            proc = _worker(queue_name, redis_url, "--remote", spark_connect_url, env=_env())
        else:
            proc = _worker(queue_name, redis_url, env=_env(SPARK_REMOTE=spark_connect_url))
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-5000:]
        result = q.get_job_result(job.id)
    assert result["count"] == 4321, out[-3000:]
    assert result["session"].startswith("pyspark.sql.connect")
    assert result["tags"] == [f"chasqui-{job.id}"]  # in place of the job group
    assert f"Spark Connect session to {spark_connect_url} up" in out
    assert "JVM signal forwarding and the JVM watchdog are skipped" in out
    assert "reached max_jobs=1" in out


def test_spark_worker_rejects_a_remote_that_is_not_spark_connect(redis_url: str, queue_name: str) -> None:
    proc = _worker(queue_name, redis_url, "--remote", "http://user:s3cret@host:15002/x", env=_env())
    assert proc.returncode == 2 and "must be a Spark Connect URL" in proc.stderr, proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr and "SparkSession" not in proc.stderr


def test_a_handler_stopping_its_connect_session_stops_the_worker(
    spark_connect_url: str, redis_url: str, queue_name: str
) -> None:
    """Over Spark Connect as on a local session (``tests/spark/test_spark_session_guard.py``):
    the job that stopped the session fails as unrecoverable and the worker exits 1, leaving the
    queue's other job for a worker with a live session."""
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        stopper = q.add("spark_connect_stop_session", {}, attempts=3)
        after = q.add("spark_connect_count", {"n": 5}, attempts=3)
        proc = subprocess.run(
            [sys.executable, "-m", "airflow_provider_chasqui.worker.spark", "-q", queue_name]
            + ["--redis-url", redis_url, "-H", "spark_test_handlers", "--concurrency", "1", "--prefetch", "1"]
            + ["--no-scheduler", "--idle-exit", "30", "--remote", spark_connect_url],
            check=False,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 1, out[-5000:]
        assert not any(line.startswith("Traceback") for line in out.splitlines()), out[-5000:]
        failure = q.get_failure(stopper.id)
        assert failure is not None and failure.reason == "unrecoverable" and "spark.stop()" in failure.error
        assert {row["job_id"] for row in q.peek_dlq(10)} == {stopper.id}
        assert q.get_job_state(after.id) not in ("completed", "failed")
