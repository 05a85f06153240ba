"""Rows per second from a DataFrame into a queue through ``df.write.format("chasqui")`` (the
Arrow data source), against the raw ``SyncQueue.add_bulk`` rate measured in the same run; and
events per second read back into a DataFrame through ``spark.read.format("chasqui")``, against
a plain XRANGE loop in one process.

    python benchmarks/bench_spark_datasource.py                    # 1,000,000 rows, local[2], 3 runs
    python benchmarks/bench_spark_datasource.py --rows 200000 --with-rows --json
    python benchmarks/bench_spark_datasource.py --mode read --rows 1000000   # the read side only

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

Read (``--mode read`` or ``both``, the default): ``--rows`` events (fields as the engine writes
them: e, id, ts, n, attempt) are added to the queue's events stream once, untimed.  Each run
times, in this order: the plain loop (one process, ``XRANGE ... COUNT 10000`` pages, each entry
decoded into the same row tuple the data source yields), ``spark.read.format("chasqui")
.option("what", "events").load().count()``, and the same read forced through every column
(``.write.format("noop")``).  Both Spark reads go through the Python data source: each row is
built in a Python worker and handed to the JVM as Arrow batches, even for ``count()``.  Ratios
are Spark's rate over the plain loop's, the median of the per-run ratios.
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
from bench_spark_bulk import (
    raw_add_bulk_rate,  # the same baseline as the row-loop benchmark
)

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.settings import QueueSettings

EVENT_NAMES = ("send", "render", "bill")
#: Events per XADD pipeline when filling the stream (not timed).
_FILL = 10_000


def _clear(r: redis.Redis, queue: str) -> None:
    prefix = QueueKeys.for_queue(queue).prefix
    keys = list(r.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + "*", count=10_000))
    for i in range(0, len(keys), 1000):
        r.unlink(*keys[i : i + 1000])


def fill_events(r: redis.Redis, queue: str, rows: int) -> None:
    """``rows`` events shaped as the engine's (completed/failed, job id, ts, name, attempt)."""
    key = QueueKeys.for_queue(queue).events
    ts = int(time.time() * 1000)
    for lo in range(0, rows, _FILL):
        pipe = r.pipeline(transaction=False)
        for i in range(lo, min(rows, lo + _FILL)):
            pipe.xadd(
                key,
                {
                    "e": "failed" if i % 10 == 0 else "completed",
                    "id": f"job-{i:09d}",
                    "ts": ts + i // 100,
                    "n": EVENT_NAMES[i % 3],
                    "attempt": 1 + (i % 10 == 0),
                },
            )
        pipe.execute()
    assert r.xlen(key) == rows, (r.xlen(key), rows)


def plain_read_rate(url: str, queue: str, page: int = 10_000) -> tuple[int, float]:
    """One process: XRANGE pages of ``page`` through the whole events stream, each entry decoded
    into the row the data source yields.  Returns (rows, rows/s)."""
    from airflow_provider_chasqui.core.calls import command, str_reply
    from airflow_provider_chasqui.spark.datasource.reader import event_row
    from airflow_provider_chasqui.sync._driver import SyncDriver

    key = QueueKeys.for_queue(queue).events
    driver = SyncDriver(url)
    try:
        n, start, started = 0, "-", time.perf_counter()
        while True:
            entries = driver.call(command("XRANGE", key, start, "+", "COUNT", page)) or []
            for eid, flat in entries:
                event_row(eid, flat)
            n += len(entries)
            if len(entries) < page:
                break
            start = "(" + str_reply(entries[-1][0])
        return n, n / (time.perf_counter() - started)
    finally:
        driver.close()


def read_bench(spark, r: redis.Redis, args: argparse.Namespace, queue: str) -> dict:
    """The read side: see the module docstring."""
    started = time.perf_counter()
    fill_events(r, queue, args.rows)
    print(f"filled {args.rows:,} events in {time.perf_counter() - started:.1f} s (not timed)", flush=True)

    def frame():
        f = (
            spark.read.format("chasqui")
            .option("queue", queue)
            .option("redis_url", args.redis_url)
            .option("what", "events")
        )
        if args.read_partitions:
            f = f.option("partitions", args.read_partitions)
        return f.load()

    assert frame().limit(10).count() == min(10, args.rows)  # untimed: Python workers up
    plain, counts, noops = [], [], []
    for i in range(args.runs):
        n, rate = plain_read_rate(args.redis_url, queue)
        assert n == args.rows, (n, args.rows)
        plain.append(rate)
        started = time.perf_counter()
        assert frame().count() == args.rows
        counts.append(args.rows / (time.perf_counter() - started))
        started = time.perf_counter()
        frame().write.format("noop").mode("overwrite").save()
        noops.append(args.rows / (time.perf_counter() - started))
        print(
            f'read run {i + 1}: plain XRANGE loop {plain[-1]:,.0f} rows/s; format("chasqui") count() '
            f"{counts[-1]:,.0f} rows/s; every column (noop write) {noops[-1]:,.0f} rows/s",
            flush=True,
        )
    out = {
        "rows": args.rows,
        "plain_runs": [round(x) for x in plain],
        "plain_median": round(statistics.median(plain)),
        "count_runs": [round(x) for x in counts],
        "count_median": round(statistics.median(counts)),
        "noop_runs": [round(x) for x in noops],
        "noop_median": round(statistics.median(noops)),
        "count_ratio": round(statistics.median(a / b for a, b in zip(counts, plain)), 3),
        "noop_ratio": round(statistics.median(a / b for a, b in zip(noops, plain)), 3),
        "partitions": frame().rdd.getNumPartitions(),
        "master": args.master,
    }
    print(f"read of {args.rows:,} events, {out['partitions']} partitions, {args.master}, {args.runs} runs")
    print(f"plain XRANGE loop (1 process, COUNT 10000, decoded): median {out['plain_median']:,} rows/s")
    print(f'format("chasqui") read, count(): median {out["count_median"]:,} rows/s, ratio {out["count_ratio"]:.2f}')
    print(
        f'format("chasqui") read, every column: median {out["noop_median"]:,} rows/s, '
        f"ratio {out['noop_ratio']:.2f} (median of the per-run ratios)"
    )
    return out


def write_bench(spark, r: redis.Redis, args: argparse.Namespace, queue: str, settings: QueueSettings) -> dict:
    """The write side: see the module docstring."""
    from pyspark.sql import functions as F

    from airflow_provider_chasqui.spark import enqueue_dataframe

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
            enqueue_dataframe(df, queue, redis_url=args.redis_url, name="sale", max_stream_len=settings.max_stream_len)
            elapsed = time.perf_counter() - started
            assert r.xlen(stream) == args.rows
            row_rates.append(args.rows / elapsed)
            line += f"; enqueue_dataframe: {args.rows / elapsed:,.0f} rows/s"
            _clear(r, queue)
        print(line, flush=True)
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
    df.unpersist()
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--chunk-size", type=int, default=None, help="rows per script call (default: the source's)")
    p.add_argument("--partitions", type=int, default=None, help="default: the master's default parallelism")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--raw-rows", type=int, default=None, help="rows for the add_bulk baseline (default rows/5)")
    p.add_argument("--with-rows", action="store_true", help="also time enqueue_dataframe (the wrapper)")
    p.add_argument(
        "--mode",
        choices=("write", "read", "both"),
        default="both",
        help="the write benchmark, the read benchmark, or both (default)",
    )
    p.add_argument(
        "--read-partitions",
        type=int,
        default=None,
        help="partitions option of the read (default: the source's, one per 100,000 entries)",
    )
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
    summary: dict = {"rows": args.rows}
    try:
        if args.mode in ("write", "both"):
            summary.update(write_bench(spark, r, args, queue, settings))
        if args.mode in ("read", "both"):
            _clear(r, queue)
            summary["read"] = read_bench(spark, r, args, queue)
    finally:
        _clear(r, queue)
        spark.stop()
    if args.json:
        print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
