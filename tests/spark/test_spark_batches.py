"""Issue 25: batch handlers in the Spark worker, as a list or as one DataFrame (``jobs_df``).

A real worker on Redis, its handlers wrapped by the Spark runtime as the Spark worker wraps them
(``bind(..., wrap=runtime.wrap)``), and a real ``local[2]`` SparkSession.  A DataFrame batch of
100 with one job failing on its first attempt settles 99 completed and 1 retried (then
completed); results and errors come back per job; misshapen replies fail with a reason.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from engine_support import events_of, raw_async, running, wait_until

from airflow_provider_chasqui import ConfigError, Queue, Worker, WorkerSettings
from airflow_provider_chasqui.worker import spark as spark_entry
from airflow_provider_chasqui.worker.registry import bind, handler

pytestmark = pytest.mark.timeout(300)


def _worker(spark: Any, url: str, queue: str, table: dict[str, Any]) -> tuple[Worker, Any]:
    runtime = spark_entry.SparkRuntime(spark, queue)
    bound = bind(table, {"spark": spark}, wrap=runtime.wrap)
    settings = WorkerSettings(concurrency=1, store_results=True, read_count=100)
    return Worker(queue, bound, redis_url=url, settings=settings), runtime


async def test_a_dataframe_batch_of_100_settles_99_and_retries_1(spark: Any, redis_url: str, queue_name: str) -> None:
    if "cluster" in redis_url:
        pytest.skip("the Spark side does not depend on the server's topology")
    from pyspark.sql import functions as F

    sizes: list[int] = []

    @handler("score", batch=100)
    def score(jobs_df, spark):
        sizes.append(jobs_df.count())
        n = F.get_json_object("data", "$.n").cast("int")
        return jobs_df.select(
            "id",
            F.struct((n * 10).alias("score"), F.col("attempt")).alias("result"),
            F.when((n == 37) & (F.col("attempt") == 0), F.lit("model not warm")).alias("error"),
        )

    q = Queue(queue_name, redis_url=redis_url)
    jobs = await q.add_bulk([{"name": "score", "data": {"n": i}, "backoff": 50} for i in range(100)])
    worker, runtime = _worker(spark, redis_url, queue_name, {"score": score})
    try:
        async with running(worker):
            results = await asyncio.gather(*(j.wait_for_result(timeout=120) for j in jobs))
    finally:
        runtime._finished.set()
        await q.close()
    assert [r["score"] for r in results] == [i * 10 for i in range(100)]
    assert results[37]["attempt"] == 1 and all(r["attempt"] == 0 for i, r in enumerate(results) if i != 37)
    assert sum(sizes) == 101 and len(sizes) <= 10  # batched: 100 jobs and the retried one
    client = raw_async(redis_url)
    try:
        events = await events_of(client, queue_name)
    finally:
        await client.aclose()
    by_kind: dict[str, list[str]] = {}
    for e in events:
        by_kind.setdefault(e["e"], []).append(e["id"])
    assert by_kind["failed"] == [jobs[37].id] and by_kind["retry-scheduled"] == [jobs[37].id]
    assert len(by_kind["completed"]) == 100 and "dlq" not in by_kind


async def test_list_batches_and_misshapen_dataframes_in_the_spark_worker(
    spark: Any, redis_url: str, queue_name: str
) -> None:
    """A list batch handler with ``spark`` runs its batch in one Spark job group; a DataFrame
    reply without the row of a job fails that job, one without an id column fails every job of
    the call, each with the reason."""
    if "cluster" in redis_url:
        pytest.skip("the Spark side does not depend on the server's topology")

    @handler("sum", batch=20)
    def total(jobs, spark):
        n = spark.range(len(jobs)).count()
        return [j.data * 2 + 0 * n for j in jobs]

    @handler("holes", batch=20)
    def holes(jobs_df, spark):
        return jobs_df.where("data != '3'").selectExpr("id", "cast(data as int) * 3 as result")

    @handler("shapeless", batch=20)
    def shapeless(jobs_df, spark):
        return jobs_df.select("name")

    q = Queue(queue_name, redis_url=redis_url)
    worker, runtime = _worker(spark, redis_url, queue_name, {"sum": total, "holes": holes, "shapeless": shapeless})
    try:
        async with running(worker):
            sums = await q.add_bulk([{"name": "sum", "data": i} for i in range(10)])
            gaps = await q.add_bulk([{"name": "holes", "data": i, "attempts": 1} for i in range(5)])
            bad = await q.add_bulk([{"name": "shapeless", "data": i, "attempts": 1} for i in range(2)])
            assert await asyncio.gather(*(j.wait_for_result(timeout=120) for j in sums)) == [i * 2 for i in range(10)]
            kept = [g for g in gaps if g.data != 3]
            assert await asyncio.gather(*(j.wait_for_result(timeout=120) for j in kept)) == [0, 3, 6, 12]
            for job in [gaps[3], *bad]:
                await wait_until(lambda j=job: q.get_failure(j.id), 60, what=f"{job.name} {job.data} to fail")
            hole = await q.get_failure(gaps[3].id)
            assert "has no row for job" in hole.error
            for job in bad:
                failure = await q.get_failure(job.id)
                assert "needs an id column and a result or error column" in failure.error
    finally:
        runtime._finished.set()
        await q.close()


def test_a_jobs_df_handler_needs_a_batch_size_and_spark() -> None:
    def no_batch(jobs_df, spark):
        return jobs_df

    @handler("x", batch=5)
    def no_spark(jobs_df):
        return jobs_df

    for fn in (no_batch, no_spark):
        with pytest.raises(ConfigError, match="takes jobs_df"):
            bind({"x": fn}, {"spark": object()})
