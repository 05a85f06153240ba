"""Rows per second from a DataFrame into a queue through ``df.write.format("chasqui")`` (the
Arrow data source), against the raw ``SyncQueue.add_bulk`` rate measured in the same run.

    python benchmarks/bench_spark_datasource.py                    # 1,000,000 rows, local[2], 3 runs
    python benchmarks/bench_spark_datasource.py --rows 200000 --with-rows --json

Each run starts from an empty stream and checks afterwards that XLEN equals the row count; an
untimed warm-up write first starts Spark's Python workers.  The DataFrame (id, region, amount,
day) is generated and cached before timing, so the time is the load itself: Arrow batches
turned into envelopes with deterministic ids, and one idempotent Lua call per chunk.  The raw
rate is one process calling ``add_bulk`` on prebuilt dicts of the same shape (``--raw-rows``
of them, 1,000 per call; random ids, no idempotency markers), measured right before each
DataFrame run; the ratio is the median of the per-run ratios.  ``--with-rows`` also times
``enqueue_dataframe`` on the same DataFrame (now a thin wrapper over the data source; before
that it moved Row objects through ``foreachPartition``: 36,503 rows/s in the run where this
source did 138,063, see docs/spark.md).  On a
2-core machine Spark's two Python workers, the JVM and Redis share the cores, so read the
ratio rather than the absolutes.  Uses a queue of its own on ``--redis-url`` and deletes its
keys at the end.
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
from bench_spark_bulk import raw_add_bulk_rate  # the same baseline as the row-loop benchmark

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.settings import QueueSettings


def _clear(r: redis.Redis, queue: str) -> None:
    prefix = QueueKeys.for_queue(queue).prefix
    keys = list(r.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=10_000))
    for i in range(0, len(keys), 1000):
        r.unlink(*keys[i : i + 1000])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=None, help="rows per script call (default: the source's)")
    p.add_argument("--partitions", type=int, default=None, help="default: the master's default parallelism")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--raw-rows", type=int, default=None, help="rows for the add_bulk baseline (default rows/5)")
    p.add_argument("--with-rows", action="store_true", help="also time enqueue_dataframe (the wrapper)")
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    p.add_argument("--json", action="store_true", help="also print one JSON line")
    args = p.parse_args(argv)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    queue = f"bench-sparkds-{uuid.uuid4().hex[:8]}"
    settings = QueueSettings(max_stream_len=max(args.rows, args.raw_rows or 0) * 2)
    r = redis.Redis.from_url(args.redis_url)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # pyspark 4.3 on pandas 3
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        from airflow_provider_chasqui.spark import enqueue_dataframe
        from airflow_provider_chasqui.spark.datasource import register

        spark = (
            SparkSession.builder.master(args.master)
            .appName("bench-spark-datasource")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .getOrCreate()
        )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
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

    def write(frame, name: str) -> None:
        w = (
            frame.write.format("chasqui")
            .option("queue", queue)
            .option("redis_url", args.redis_url)
            .option("name", name)
            .option("max_stream_len", settings.max_stream_len)
        )
        if args.chunk_size:
            w = w.option("chunk_size", args.chunk_size)
        w.mode("append").save()

    stream = QueueKeys.for_queue(queue).stream
    try:
        write(spark.range(2000, numPartitions=parts), "warm")  # not timed: Python workers, scripts
        _clear(r, queue)
        raw_rows = args.raw_rows or max(1000, args.rows // 5)
        raw: list[float] = []
        rates: list[float] = []
        row_rates: list[float] = []
        for i in range(args.runs):
            # Raw and DataFrame runs alternate, so both see the same machine load.
            raw.append(raw_add_bulk_rate(args.redis_url, queue, raw_rows, 1000, settings))
            _clear(r, queue)
            started = time.perf_counter()
            write(df, "sale")
            elapsed = time.perf_counter() - started
            assert r.xlen(stream) == args.rows, (r.xlen(stream), args.rows)
            rates.append(args.rows / elapsed)
            line = (
                f"run {i + 1}: {args.rows:,} rows in {elapsed:.2f} s = {args.rows / elapsed:,.0f} rows/s "
                f"(raw add_bulk just before: {raw[-1]:,.0f} rows/s)"
            )
            _clear(r, queue)
            if args.with_rows:
                started = time.perf_counter()
                enqueue_dataframe(
                    df, queue, redis_url=args.redis_url, name="sale", max_stream_len=settings.max_stream_len
                )
                elapsed = time.perf_counter() - started
                assert r.xlen(stream) == args.rows
                row_rates.append(args.rows / elapsed)
                line += f"; enqueue_dataframe: {args.rows / elapsed:,.0f} rows/s"
                _clear(r, queue)
            print(line, flush=True)
    finally:
        _clear(r, queue)
        spark.stop()
    med, raw_med = statistics.median(rates), statistics.median(raw)
    ratio = statistics.median(a / b for a, b in zip(rates, raw))
    print(
        f'format("chasqui") write: median {med:,.0f} rows/s over {args.runs} runs of {args.rows:,} rows '
        f"({parts} partitions, {args.master})"
    )
    print(f"raw SyncQueue.add_bulk (1 process, {raw_rows:,} rows, 1,000 per call): median {raw_med:,.0f} rows/s")
    print(f'ratio format("chasqui") / raw add_bulk: {ratio:.2f} (median of the per-run ratios)')
    summary = {
        "rows": args.rows,
        "runs": [round(x) for x in rates],
        "median": round(med),
        "raw_runs": [round(x) for x in raw],
        "raw_median": round(raw_med),
        "ratio": round(ratio, 3),
        "partitions": parts,
        "master": args.master,
    }
    if row_rates:
        row_med = statistics.median(row_rates)
        print(f"enqueue_dataframe (wrapper): median {row_med:,.0f} rows/s")
        summary["rows_loader_median"] = round(row_med)
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
