"""Issue 25: the Spark worker reports a Spark handler's progress: its Spark jobs and tasks done,
from Spark's status tracker, as the job's progress (what ``chasqui job show``, the dashboard's
bar and the sensor's log read); a handler that reports its own progress wins.  A real worker on
Redis and a real ``local[2]`` SparkSession; the handlers run tasks slow enough to be seen."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from engine_support import running, wait_until

from airflow_provider_chasqui import Queue, Worker, WorkerSettings
from airflow_provider_chasqui.worker import spark as spark_entry
from airflow_provider_chasqui.worker.registry import bind

pytestmark = pytest.mark.timeout(300)


def _slow_tasks(spark: Any, n: int) -> int:
    def nap(_x: Any) -> None:
        import time as t

        t.sleep(0.3)

    spark.sparkContext.parallelize(range(n), n).foreach(nap)
    return n


async def test_a_spark_handler_reports_its_spark_jobs_and_tasks(spark: Any, redis_url: str, queue_name: str) -> None:
    if "cluster" in redis_url:
        pytest.skip("the Spark side does not depend on the server's topology")
    runtime = spark_entry.SparkRuntime(spark, queue_name)

    def crunch(job: Any, spark: Any) -> int:
        return _slow_tasks(spark, 8) + spark.range(100).count()

    def own(job: Any, spark: Any) -> str:
        _slow_tasks(spark, 4)
        job.update_progress_sync({"stage": "mine"})
        _slow_tasks(spark, 4)  # Spark reports stop once the handler reported its own
        return "ok"

    table = bind({"crunch": crunch, "own": own}, {"spark": spark}, wrap=runtime.wrap)  # as the Spark worker does
    q = Queue(queue_name, redis_url=redis_url)
    worker = Worker(queue_name, table, redis_url=redis_url, settings=WorkerSettings(concurrency=2, store_results=True))
    runtime.watch_progress(interval=0.1)
    try:
        async with running(worker):
            job = await q.add("crunch", {})

            async def mid_run() -> Any:
                p = (await q.get_job_details(job.id)).progress
                return p and 0 < p["tasks_done"] < p["tasks"]

            seen = await wait_until(mid_run, 120, what="progress while the tasks run", interval=0.05)
            assert seen
            assert await q.wait_for_result(job.id, timeout=60) == 108

            async def final() -> Any:  # the handler's last report: every Spark job it ran, done
                p = (await q.get_job_details(job.id)).progress
                return p if p["spark_jobs"] == p["spark_jobs_done"] and p["tasks"] == p["tasks_done"] else None

            done = await wait_until(final, 10, what="the final Spark progress")
            assert done["spark_jobs"] >= 2 and done["tasks"] >= 9, done  # the 8 slow tasks and the count's
            mine = await q.add("own", {})
            assert await q.wait_for_result(mine.id, timeout=120) == "ok"
            await asyncio.sleep(0.5)  # longer than the poll and the worker's flush: a late Spark report would land
            assert (await q.get_job_details(mine.id)).progress == {"stage": "mine"}
    finally:
        runtime._finished.set()
        await q.close()
