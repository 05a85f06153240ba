"""Rows per second from a DataFrame into a queue with ``enqueue_dataframe``, against the raw
``SyncQueue.add_bulk`` rate measured in the same run.

    python benchmarks/bench_spark_bulk.py                    # 1,000,000 rows, local[2], 3 runs
    python benchmarks/bench_spark_bulk.py --rows 200000 --batch 5000 --json

Each run starts from an empty stream and checks afterwards that XLEN equals the row count; an
untimed warm-up load first starts Spark's Python workers.
The DataFrame (id, region, amount, day) is generated and cached before timing, so the time is
the load itself: Python workers turning rows into envelopes, and the Lua batch calls.  The raw
rate is one process calling ``add_bulk`` on prebuilt dicts of the same shape (``--raw-rows``
of them, ``--batch`` per call), measured right before each DataFrame run; the ratio is the
median of the per-run ratios.  On a 2-core machine Spark's two Python workers, the JVM and
Redis share the cores, so read the ratio rather than the absolutes.  Uses a queue of its own
on ``--redis-url`` and deletes its keys at the end.  Called as ``main(argv)`` in a process that
already has an active SparkSession (a notebook, a test), it runs in that session (``--master``
then does not apply), unpersists its DataFrame and leaves the session running; a session it
started itself it stops.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
import warnings

import redis

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.settings import QueueSettings
from airflow_provider_chasqui.spark import enqueue_dataframe


def _clear(r: redis.Redis, queue: str) -> None:
    k = QueueKeys.for_queue(queue)
    r.delete(k.stream, k.delayed, k.events)


def raw_add_bulk_rate(url: str, queue: str, rows: int, batch: int, settings: QueueSettings) -> float:
    items = [
        {"name": "sale", "data": {"id": i, "region": f"r{i % 7}", "amount": i * 0.25, "day": "2026-01-01"}}
        for i in range(batch)
    ]
    r = redis.Redis.from_url(url)
    _clear(r, queue)
    with SyncQueue(queue, redis_url=url, settings=settings) as q:
        q.add_bulk(items[:10])  # scripts loaded, connection open
        _clear(r, queue)
        sent, started = 0, time.perf_counter()
        while sent < rows:
            q.add_bulk(items)
            sent += len(items)
        elapsed = time.perf_counter() - started
    assert r.xlen(QueueKeys.for_queue(queue).stream) == sent
    _clear(r, queue)
    r.close()
    return sent / elapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch", type=int, default=1000, help="rows per round trip (enqueue_dataframe batch=)")
    p.add_argument("--partitions", type=int, default=None, help="default: the master's default parallelism")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--raw-rows", type=int, default=None, help="rows for the add_bulk baseline (default rows/5)")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--json", action="store_true", help="also print one JSON line")
    args = p.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    queue = f"bench-spark-{uuid.uuid4().hex[:8]}"
    settings = QueueSettings(max_stream_len=max(args.rows, args.raw_rows or 0) * 2)
    r = redis.Redis.from_url(args.redis_url)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyspark 4.3 on pandas 3
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        found = SparkSession.getActiveSession()  # left running at the end; one started here is stopped
        spark = (
            SparkSession.builder.master(args.master)
            .appName("bench-spark-bulk")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
    spark.sparkContext.setLogLevel("ERROR")
    master = spark.sparkContext.master  # the session's own: a found one keeps its master
    parts = args.partitions or spark.sparkContext.defaultParallelism
    df = (
        spark.range(args.rows, numPartitions=parts)
        .select(
            F.col("id"),
            F.concat(F.lit("r"), (F.col("id") % 7).cast("string")).alias("region"),
            (F.col("id") * 0.25).alias("amount"),
            F.lit("2026-01-01").alias("day"),
        )
        .cache()
    )
    assert df.count() == args.rows

    try:
        # Warm-up (not timed): starts the Python workers and loads the Lua scripts.
        enqueue_dataframe(spark.range(2000, numPartitions=parts), queue, redis_url=args.redis_url, name="warm")
        _clear(r, queue)
        raw_rows = args.raw_rows or max(args.batch, args.rows // 5)
        raw: list[float] = []
        rates: list[float] = []
        for i in range(args.runs):
            # Raw and DataFrame runs alternate, so both see the same machine load.
            raw.append(raw_add_bulk_rate(args.redis_url, queue, raw_rows, args.batch, settings))
            _clear(r, queue)
            started = time.perf_counter()
            n = enqueue_dataframe(
                df,
                queue,
                redis_url=args.redis_url,
                name="sale",
                batch=args.batch,
                max_stream_len=settings.max_stream_len,
            )
            elapsed = time.perf_counter() - started
            assert n == args.rows and r.xlen(QueueKeys.for_queue(queue).stream) == args.rows, (n, args.rows)
            rates.append(n / elapsed)
            print(
                f"run {i + 1}: {n:,} rows in {elapsed:.2f} s = {n / elapsed:,.0f} rows/s "
                f"(raw add_bulk just before: {raw[-1]:,.0f} rows/s)",
                flush=True,
            )
    finally:
        _clear(r, queue)
        df.unpersist()
        if found is None:
            spark.stop()
    med, raw_med = statistics.median(rates), statistics.median(raw)
    ratio = statistics.median(a / b for a, b in zip(rates, raw))
    print(
        f"enqueue_dataframe: median {med:,.0f} rows/s over {args.runs} runs of {args.rows:,} rows "
        f"({parts} partitions, {master}, batch {args.batch})"
    )
    print(f"raw SyncQueue.add_bulk (1 process, {raw_rows:,} rows, batch {args.batch}): median {raw_med:,.0f} rows/s")
    print(f"ratio enqueue_dataframe / raw add_bulk: {ratio:.2f} (median of the per-run ratios)")
    if args.json:
        print(
            json.dumps(
                {
                    "rows": args.rows,
                    "runs": [round(x) for x in rates],
                    "median": round(med),
                    "raw_runs": [round(x) for x in raw],
                    "raw_median": round(raw_med),
                    "ratio": round(ratio, 3),
                    "partitions": parts,
                    "batch": args.batch,
                    "master": master,
                }
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
