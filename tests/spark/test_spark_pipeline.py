"""The example Spark pipeline end to end, every part real: a Spark worker started with
``spark-submit --master local[2] worker/spark.py``, Redis, and ``example_dags/spark_sales_pipeline.py``
run with ``dag.test()`` (its deferrable sensor's trigger runs inline).  Then the same worker is
stopped the way a pod is: SIGTERM to spark-submit's process (the JVM), mid Spark job.

Times are printed (``-s``) and checked against generous limits only.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from engine_support import wait_until_sync

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.examples.spark_handlers import expected_rollup
from airflow_provider_chasqui.worker import spark as spark_entry

# Generous: two JVMs, Airflow's start-up and a DAG run each; ~2 min on an idle 2-core machine,
# several times that when the machine is shared.
pytestmark = pytest.mark.timeout(1500)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
WORKER_TESTS = HERE.parent / "worker"
sys.path.insert(0, str(WORKER_TESTS))
from servers import free_port  # noqa: E402
from worker_support import WorkerProc, http_get, metric_value  # noqa: E402

ROWS = 20_000


def _delete_keys(url: str, queue: str) -> None:
    prefix = "".join("\\" + c if c in "*?[]\\" else c for c in QueueKeys.for_queue(queue).prefix)
    with redis.Redis.from_url(url) as r:
        keys = list(r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            r.unlink(*keys)


@pytest.fixture(scope="module")
def pipeline(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A Spark worker (spark-submit) and a migrated AIRFLOW_HOME, started side by side."""
    tmp = tmp_path_factory.mktemp("spark-pipeline")
    queue = f"t-spark-{uuid.uuid4().hex[:8]}"
    port = free_port()
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ)
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    started = time.monotonic()
    worker = WorkerProc(
        [
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.ui.showConsoleProgress=false",
            spark_entry.__file__,
            "--queue",
            queue,
            "--redis-url",
            redis_url,
            "--handlers",
            "airflow_provider_chasqui.examples.spark_handlers",
            "--handlers",
            "spark_test_handlers",
            "--shutdown-deadline",
            "90",
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
        ],
        tmp / "spark-worker.log",
        env=env,
        command=[str(bin_dir / "spark-submit"), "--master", "local[2]"],
    )

    home, dags = tmp / "airflow-home", tmp / "airflow-home" / "dags"
    dags.mkdir(parents=True)
    for dag_file in ("spark_sales_pipeline.py", "spark_batch_worker.py"):
        shutil.copy(ROOT / "example_dags" / dag_file, dags)
    parsed = redis.connection.parse_url(redis_url)
    airflow_env = {
        **env,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
        "AIRFLOW_CONN_CHASQUI_DEFAULT": json.dumps(
            {
                "conn_type": "chasqui",
                "host": parsed.get("host", "127.0.0.1"),
                "port": parsed.get("port", 6379),
                "extra": {"db": parsed.get("db", 0)},
            }
        ),
    }
    try:
        migrate = subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env=airflow_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert migrate.returncode == 0, migrate.stdout[-3000:] + migrate.stderr[-3000:]
        worker.wait_for_log(f"consuming {queue}", timeout=600)
        batch_queue = f"{queue}-batch"
        yield {
            "queue": queue,
            "batch_queue": batch_queue,
            "worker": worker,
            "port": port,
            "env": airflow_env,
            "data": tmp / "data",
            "started": started,
            "tmp": tmp,
        }
    finally:
        worker.kill()
        _delete_keys(redis_url, queue)
        _delete_keys(redis_url, f"{queue}-batch")


@pytest.fixture(scope="module")
def dag_runs(pipeline: dict, redis_url: str) -> dict:
    """Both Spark example DAGs with ``dag.test()`` in one runner process (Airflow starts once)."""
    plan = [
        ["chasqui_spark_sales_pipeline", {"queue": pipeline["queue"], "data_dir": str(pipeline["data"]), "rows": ROWS}],
        [
            "chasqui_spark_batch_worker",
            {
                "queue": pipeline["batch_queue"],
                "data_dir": str(pipeline["data"]),
                "datasets": 2,
                "max_jobs": 2,
                "idle_exit_secs": 60,
            },
        ],
    ]
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "airflow" / "run_dag.py"), json.dumps(plan)],
        env=pipeline["env"],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-5000:]
    runs = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return {
        "pipeline": runs[0],
        "batch": runs[1],
        "log": proc.stdout + proc.stderr,
        "process_seconds": time.monotonic() - t0,
    }


def test_sales_pipeline_dag_end_to_end(pipeline: dict, dag_runs: dict) -> None:
    run = dag_runs["pipeline"]
    assert run["state"] == "success", (run["tis"], dag_runs["log"][-5000:])
    assert run["tis"] == dict.fromkeys(
        ["generate_sales", "enqueue_rollup", "wait_for_rollup", "check_rollup"], "success"
    )

    dataset, result = run["xcom"]["generate_sales.return_value"], run["xcom"]["wait_for_rollup.return_value"]
    expected = expected_rollup(dataset["input"])
    assert result["job_id"] == run["xcom"]["enqueue_rollup.return_value"]
    assert (result["rows"], result["input_rows"]) == (len(expected), ROWS)
    assert result["revenue"] == pytest.approx(sum(v[2] for v in expected.values()), abs=0.05)
    assert run["xcom"]["check_rollup.return_value"]["rollup_rows"] == len(expected)

    import pyarrow.parquet as pq  # the worker's output, compared with a plain-Python rollup of the CSV

    table = pq.read_table(result["output"]).to_pylist()
    got = {(str(r["day"]), r["region"]): (r["orders"], r["units"], r["revenue"]) for r in table}
    assert got.keys() == expected.keys()
    for key, (orders, units, revenue) in expected.items():
        assert got[key][:2] == (orders, units) and got[key][2] == pytest.approx(revenue, abs=0.01)

    text = http_get(f"http://127.0.0.1:{pipeline['port']}/metrics")[1]
    labels = {"queue": pipeline["queue"], "name": "sales_rollup"}
    assert metric_value(text, "chasqui_jobs_completed_total", **labels) == 1
    job_s = metric_value(text, "chasqui_handler_duration_seconds_sum", **labels)
    print(
        f"\nspark pipeline: dag.test {run['seconds']:.1f}s, Spark job {job_s:.2f}s, {ROWS} rows -> "
        f"{len(expected)} rollup rows (runner process for both DAGs {dag_runs['process_seconds']:.1f}s)"
    )
    assert run["seconds"] < 180


def test_spark_submit_operator_runs_a_batch_worker(pipeline: dict, dag_runs: dict, redis_url: str) -> None:
    run = dag_runs["batch"]
    assert run["state"] == "success", (run["tis"], dag_runs["log"][-8000:])
    assert run["tis"] == {"seed_batch": "success", "drain_with_spark": "success"}
    ids = run["xcom"]["seed_batch.return_value"]
    with SyncQueue(pipeline["batch_queue"], redis_url=redis_url) as q:
        results = q.get_job_result_bulk(ids)
    assert [r["job_id"] for r in results] == ids and all(r["input_rows"] == 5_000 for r in results)
    log = dag_runs["log"]
    assert "reached max_jobs=2" in log  # the worker's own log, streamed into the task log
    print(f"\nspark batch worker DAG (SparkSubmitOperator): dag.test {run['seconds']:.1f}s")


def _python_child(pid: int) -> int:
    """The Python driver process spark-submit's JVM started (found through /proc)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            if b"spark.py" in Path(f"/proc/{child}/cmdline").read_bytes():
                return int(child)
    raise AssertionError(f"no Python child of {pid}")


def test_sigterm_to_spark_submit_lets_the_running_spark_job_finish(pipeline: dict, redis_url: str) -> None:
    """As a pod stop with an init that signals the whole group (dumb-init): the JVM and the
    Python driver both get SIGTERM; the JVM's copy is forwarded and counted once."""
    worker: WorkerProc = pipeline["worker"]
    hold_dir = pipeline["tmp"] / "hold"
    hold_dir.mkdir()
    driver = _python_child(worker.pid)
    with SyncQueue(pipeline["queue"], redis_url=redis_url) as q:
        held = q.add("spark_hold", {"dir": str(hold_dir), "n": 12345})
        wait_until_sync(lambda: any(hold_dir.glob("started-*")), 300, what="the Spark handler running")
        worker.signal(signal.SIGTERM)  # the pid is the JVM: spark-submit execs java
        os.kill(driver, signal.SIGTERM)
        worker.wait_for_log("no longer reading", timeout=120)
        late = q.add("spark_hold", {"dir": str(hold_dir)})  # a stopping worker reads nothing new
        assert worker.proc.poll() is None
        (hold_dir / "release").write_text("go")
        assert worker.wait_exit(600) == 0, worker.output()[-5000:]
        assert q.get_job_result(held.id) == {"count": 12345, "job_group": f"chasqui-{held.id}"}
        assert q.get_job_result(late.id) is None
    with redis.Redis.from_url(redis_url) as r:
        stream = QueueKeys.for_queue(pipeline["queue"]).stream
        assert r.xpending(stream, "default")["pending"] == 0 and r.xlen(stream) == 1
    out = worker.output()
    assert "stopped after" in out.split("no longer reading")[1] and "again: exiting now" not in out


def test_a_dead_jvm_stops_the_python_driver(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """SIGKILL to spark-submit's JVM (as an OOM kill would): its Python child must not live on."""
    bin_dir = Path(sys.executable).parent
    env = dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    worker = WorkerProc(
        [
            "--conf",
            "spark.ui.enabled=false",
            spark_entry.__file__,
            "--queue",
            queue_name,
            "--redis-url",
            redis_url,
            "--handlers",
            "spark_test_handlers",
            "--no-scheduler",
        ],
        tmp_path / "w.log",
        env=env,
        command=[str(bin_dir / "spark-submit"), "--master", "local[1]"],
    )
    try:
        worker.wait_for_log(f"consuming {queue_name}", timeout=600)
        driver = _python_child(worker.pid)
        os.kill(worker.pid, signal.SIGKILL)
        worker.proc.wait(30)
        # Its output went through the JVM, which is gone, so the proof is the exit itself: without
        # the watchdog the orphan kept consuming (and failing) jobs indefinitely.
        wait_until_sync(lambda: not Path(f"/proc/{driver}").exists(), 120, what="the orphaned driver to exit")
    finally:
        worker.kill()


def test_chasqui_worker_starts_a_session_for_spark_handlers(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """Plain ``chasqui worker`` (no spark-submit): pyspark starts the JVM in the worker process."""
    env = dict(
        os.environ,
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("spark_count", {"n": 777})
        worker = WorkerProc(
            [
                "-q",
                queue_name,
                "-H",
                "spark_test_handlers:spark_count",
                "--redis-url",
                redis_url,
                "--max-jobs",
                "1",
                "--no-scheduler",
            ],
            tmp_path / "w.log",
            env=env,
        )
        assert worker.wait_exit(600) == 0, worker.output()[-5000:]
        result = q.get_job_result(job.id)
    assert result["count"] == 777 and result["master"].startswith("local")
    assert "use Spark: starting a SparkSession in this process" in worker.output()


def test_spark_entry_rejects_bad_handlers_before_starting_spark(redis_url: str, queue_name: str) -> None:
    for args, message in (
        (["-H", "no_such_module_z"], "was not found"),
        (["-H", "spark_test_handlers", "--spark-conf", "novalue"], "--spark-conf takes KEY=VALUE"),
    ):
        proc = subprocess.run(
            [sys.executable, spark_entry.__file__, "-q", queue_name, "--redis-url", redis_url, *args],
            capture_output=True,
            text=True,
            timeout=300,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)])),
        )
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "SparkSession" not in proc.stderr
