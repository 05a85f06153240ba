"""The Spark worker's output stays readable: the FAIR pools its handler threads use are the ones
the shipped ``fairscheduler.xml`` declares (no "pool ... has not been configured" warning per
thread), and Spark logs at WARN unless ``spark.log.level`` says otherwise.

One real batch under ``spark-submit --master local[2]`` (three ``sales_rollup`` jobs, then
``--max-jobs`` ends it) counts the lines; the rest reads the session defaults, the pool file
and the pool assignment without another JVM.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.examples.spark_handlers import generate_sales_csv
from airflow_provider_chasqui.worker import spark as spark_entry
from airflow_provider_chasqui.worker import spark_session

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
#: Before this change the same batch wrote about 730 lines; now the worker's own lines, Spark's
#: start-up banner (before spark.log.level applies) and the JVM's notices remain.
MAX_LINES = 40


@pytest.mark.timeout(900)
def test_a_three_job_batch_is_quiet_and_uses_the_shipped_pools(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        jobs = []
        for i in range(3):
            made = generate_sales_csv(str(tmp_path / f"sales-{i}.csv"), rows=2_000, seed=i)
            jobs.append({"name": "sales_rollup", "data": {"input": made["path"], "output": str(tmp_path / f"r-{i}")}})
        ids = [job.id for job in q.add_bulk(jobs)]
        bin_dir = Path(sys.executable).parent
        env = dict(
            os.environ,
            SPARK_LOCAL_IP="127.0.0.1",
            PYSPARK_PYTHON=sys.executable,
            PYSPARK_DRIVER_PYTHON=sys.executable,
            PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        )
        proc = subprocess.run(
            [
                str(bin_dir / "spark-submit"),
                "--master",
                "local[2]",
                "--conf",
                "spark.ui.enabled=false",
                spark_entry.__file__,
                "--queue",
                queue_name,
                "--redis-url",
                redis_url,
                "--handlers",
                "airflow_provider_chasqui.examples.spark_handlers",
                "--max-jobs",
                "3",
                "--no-scheduler",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=800,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, out[-5000:]
        results = q.get_job_result_bulk(ids)
    assert [r["input_rows"] for r in results] == [2_000] * 3, out[-3000:]
    assert "has not been configured" not in out  # Spark's pool warning (a WARN: it would show)
    assert 'Setting Spark log level to "WARN"' in out
    assert "reached max_jobs=3" in out
    lines = out.splitlines()
    assert len(lines) <= MAX_LINES, "\n".join(lines[:80])
    print(f"\n3-job Spark batch: {len(lines)} lines of output")


def _conf(**pairs: str) -> Any:
    from pyspark import SparkConf

    conf = SparkConf(loadDefaults=False)
    for key, value in pairs.items():
        conf.set(key.replace("_", "."), value)
    return conf


def test_session_defaults_give_way_to_the_users_settings(spark: Any) -> None:
    defaults = spark_session.session_defaults(_conf(), {})
    assert defaults == {
        "spark.scheduler.mode": "FAIR",
        "spark.log.level": "WARN",
        "spark.scheduler.allocation.file": Path(spark_session.POOL_FILE).as_uri(),
    }
    # spark-submit --conf (the JVM's properties) or --spark-conf: the user's value wins
    mine = {"spark.log.level": "INFO", "spark.scheduler.allocation.file": "file:///etc/spark/pools.xml"}
    assert spark_session.session_defaults(_conf(), mine) == {"spark.scheduler.mode": "FAIR"}
    assert spark_session.session_defaults(_conf(spark_log_level="DEBUG"), {})["spark.scheduler.mode"] == "FAIR"
    assert "spark.log.level" not in spark_session.session_defaults(_conf(spark_log_level="DEBUG"), {})
    # FIFO has no pools: no allocation file then
    assert spark_session.session_defaults(_conf(), {"spark.scheduler.mode": "FIFO"}) == {"spark.log.level": "WARN"}
    assert "spark.scheduler.allocation.file" not in spark_session.session_defaults(
        _conf(spark_scheduler_mode="FIFO"), {}
    )


def test_the_pool_file_declares_every_pool_the_worker_uses(spark: Any) -> None:
    root = ET.parse(spark_session.POOL_FILE).getroot()
    pools = {p.get("name"): p.findtext("schedulingMode") for p in root.iter("pool")}
    assert pools == {f"chasqui-{i}": "FAIR" for i in range(spark_entry.POOLS)}

    runtime = spark_entry.SparkRuntime(spark, "q")
    seen: dict[str, str] = {}

    def record(name: str) -> None:
        first = runtime.pool()
        assert runtime.pool() == first  # a thread keeps its pool
        seen[name] = first

    threads = [threading.Thread(target=record, args=(f"t{i}",)) for i in range(spark_entry.POOLS + 2)]
    for t in threads:
        t.start()
        t.join(30)
    assert sorted(set(seen.values())) == sorted(pools)  # past 16 threads, pools are shared (FAIR inside)
