"""``enqueue_dataframe`` / ``upsert_specs_dataframe`` with a real local[2] SparkSession and real Redis:
what lands in the stream (decoded byte for byte), delays, idempotent ids, errors, and a real
Worker consuming a DataFrame's jobs."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pytest
import redis

from airflow_provider_chasqui import SyncQueue, Worker
from airflow_provider_chasqui.core.codec import decode_data, decode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.errors import ConfigError
from airflow_provider_chasqui.spark import enqueue_dataframe, to_plain, upsert_specs_dataframe

pytestmark = pytest.mark.timeout(600)  # the first test pays for starting the JVM


def _stream_jobs(url: str, queue: str) -> list[tuple[str, Any, str]]:
    """``(name, data, job id)`` of every stream entry, decoded with the wire codec."""
    out = []
    with redis.Redis.from_url(url) as r:
        for _id, fields in r.xrange(QueueKeys.for_queue(queue).stream):
            env = decode_envelope(fields[b"d"])
            out.append((fields.get(b"n", b"").decode(), decode_data(env.inner), env.id))
    return out


@pytest.fixture(scope="module")
def typed_df(spark):
    rows = [
        (
            i,
            "even" if i % 2 == 0 else "odd",
            decimal.Decimal(f"{i}.25"),
            dt.date(2026, 1, 1) + dt.timedelta(days=i % 3),
            dt.datetime(2026, 1, 1, 12, i % 60),
            [f"t{i % 4}"],
            (i, str(i)),
            bytearray(b"\x00\x01"),
        )
        for i in range(1000)
    ]
    schema = (
        "id BIGINT, kind STRING, amount DECIMAL(10,2), day DATE, at TIMESTAMP_NTZ, tags ARRAY<STRING>, "
        "info STRUCT<a: INT, b: STRING>, blob BINARY"
    )
    return spark.createDataFrame(rows, schema).repartition(4)


def test_rows_become_jobs_with_converted_values(typed_df, redis_url: str, queue_name: str) -> None:
    n = enqueue_dataframe(typed_df, queue_name, redis_url=redis_url, name_col="kind", batch=300)
    assert n == 1000
    jobs = _stream_jobs(redis_url, queue_name)
    assert len(jobs) == 1000 and len({j[2] for j in jobs}) == 1000
    by_id = {data["id"]: (name, data) for name, data, _ in jobs}
    name, data = by_id[7]
    assert name == "odd"
    assert data == {
        "id": 7,
        "amount": "7.25",
        "day": "2026-01-02",
        "at": "2026-01-01T12:07:00",
        "tags": ["t3"],
        "info": {"a": 7, "b": "7"},
        "blob": b"\x00\x01",
    }
    assert sorted(by_id) == list(range(1000))


def test_constant_name_one_payload_column_and_delays(spark, redis_url: str, queue_name: str) -> None:
    df = spark.createDataFrame(
        [(i, {"k": str(i)}, None if i % 2 else 60_000) for i in range(10)],
        "n INT, payload MAP<STRING,STRING>, wait BIGINT",
    )
    assert (
        enqueue_dataframe(
            df, queue_name, redis_url=redis_url, name="send", data_col="payload", delay_ms_col="wait", attempts=2
        )
        == 10
    )
    keys = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r:
        assert (r.xlen(keys.stream), r.zcard(keys.delayed)) == (5, 5)
    jobs = _stream_jobs(redis_url, queue_name)
    assert sorted(d["k"] for _n, d, _i in jobs) == ["1", "3", "5", "7", "9"]
    assert {n for n, _d, _i in jobs} == {"send"}


def test_job_id_column_makes_a_rerun_idempotent(spark, redis_url: str, queue_name: str) -> None:
    df = spark.createDataFrame([(f"order-{i}", i) for i in range(50)], "oid STRING, qty INT").repartition(3)
    for _ in range(2):  # e.g. a retried Spark stage or a re-run of the load
        assert enqueue_dataframe(df, queue_name, redis_url=redis_url, name="ship", job_id_col="oid") == 50
    jobs = _stream_jobs(redis_url, queue_name)
    assert len(jobs) == 50 and {j[2] for j in jobs} == {f"order-{i}" for i in range(50)}
    assert all(d == {"qty": int(jid.split("-")[1])} for _n, d, jid in jobs)


def test_bad_arguments_fail_on_the_driver(spark, redis_url: str, queue_name: str) -> None:
    df = spark.createDataFrame([(1, "a")], "id INT, kind STRING")
    cases = [
        (dict(name="x", name_col="kind"), "exactly one of name="),
        ({}, "exactly one of name="),
        (dict(name="x", data_cols=["id"], data_col="id"), "not both"),
        (dict(name="x", data_cols=["nope"]), "column 'nope' is not in the DataFrame"),
        (dict(name_col="missing"), "column 'missing' is not in the DataFrame"),
        (dict(name="x", batch=0), "batch must be a positive int"),
        (dict(name="x", attempts=-1), "attempts must be a non-negative int"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            enqueue_dataframe(df, queue_name, redis_url=redis_url, **kwargs)
    with redis.Redis.from_url(redis_url) as r:
        assert r.exists(QueueKeys.for_queue(queue_name).stream) == 0


def test_a_null_job_name_fails_the_spark_job_with_the_reason(spark, redis_url: str, queue_name: str) -> None:
    df = spark.createDataFrame([("ok", 1), (None, 2)], "kind STRING, v INT").coalesce(1)
    with pytest.raises(Exception, match="a job name must be a non-empty string"):
        enqueue_dataframe(df, queue_name, redis_url=redis_url, name_col="kind")


def test_to_plain_refuses_what_msgpack_cannot_carry() -> None:
    assert to_plain({"d": decimal.Decimal("1.10"), "t": (dt.time(1, 2),)}) == {"d": "1.10", "t": ["01:02:00"]}
    with pytest.raises(ConfigError, match="a object value cannot be put in a job payload"):
        to_plain(object())


async def test_a_worker_consumes_what_a_dataframe_enqueued(spark, redis_url: str, queue_name: str) -> None:
    from pyspark.sql import functions as F

    df = spark.range(2000, numPartitions=4).select(F.col("id"), (F.col("id") * 3).alias("triple"))
    assert enqueue_dataframe(df, queue_name, redis_url=redis_url, name="sum") == 2000
    seen: list[int] = []

    def add(job: Any) -> int:
        seen.append(job.data["triple"])
        return job.data["triple"]

    await Worker(
        queue_name, {"sum": add}, redis_url=redis_url, run_scheduler=False, max_jobs=2000, read_block_ms=200
    ).run()
    assert sum(seen) == 3 * sum(range(2000)) and len(seen) == 2000


def test_upsert_specs_dataframe(spark, redis_url: str, queue_name: str) -> None:
    rows = [
        (
            f"tenant-{i}",
            "report",
            "0 6 * * *" if i % 2 == 0 else None,
            "Europe/Madrid" if i % 2 == 0 else None,
            None if i % 2 == 0 else 60_000,
            i,
        )
        for i in range(40)
    ]
    df = spark.createDataFrame(rows, "key STRING, job STRING, cron STRING, tz STRING, every BIGINT, tenant INT")
    n = upsert_specs_dataframe(
        df.repartition(3),
        queue_name,
        redis_url=redis_url,
        name_col="job",
        key_col="key",
        cron_col="cron",
        tz_col="tz",
        every_ms_col="every",
        data_cols=["tenant"],
        attempts=3,
        batch=7,
    )
    assert n == 40
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        cron_spec = q.get_repeatable_job("tenant-4")
        every_spec = q.get_repeatable_job("tenant-5")
        assert len(q.get_repeatable_jobs(limit=100)) == 40
    assert cron_spec is not None and every_spec is not None
    text = repr(cron_spec)
    assert "0 6 * * *" in text and "Europe/Madrid" in text and "report" in text
    assert "60000" in repr(every_spec)
    # Re-upserting the same keys replaces, never duplicates.
    assert (
        upsert_specs_dataframe(
            df,
            queue_name,
            redis_url=redis_url,
            name_col="job",
            key_col="key",
            cron_col="cron",
            tz_col="tz",
            every_ms_col="every",
            data_cols=["tenant"],
        )
        == 40
    )
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        assert len(q.get_repeatable_jobs(limit=100)) == 40


def test_upsert_specs_needs_exactly_one_pattern_per_row(spark, redis_url: str, queue_name: str) -> None:
    df = spark.createDataFrame([("k", "job", "* * * * *", 1000)], "key STRING, job STRING, cron STRING, every BIGINT")
    with pytest.raises(Exception, match="give exactly one of a cron expression and an every_ms interval"):
        upsert_specs_dataframe(
            df, queue_name, redis_url=redis_url, name_col="job", key_col="key", cron_col="cron", every_ms_col="every"
        )
    with pytest.raises(ConfigError, match="cron_col= .* every_ms_col="):
        upsert_specs_dataframe(df, queue_name, redis_url=redis_url, name="job")


def test_the_benchmark_runs(spark: Any, redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/bench_spark_bulk.py at the smallest sizes that still run every path, so it cannot
    rot: local[2]'s two default partitions of 1,000 rows at ``--batch 500`` make each partition
    send more than one batch, and the raw baseline makes more than one ``add_bulk`` call.  The
    script's ``main`` runs in this session's JVM (it reuses an active session, unpersists its
    DataFrame and leaves the session running), not a JVM of its own: what it measures is the
    same code, and the figures come from full-size command-line runs (BENCHMARKS.md)."""
    import json
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    bench = runpy.run_path(str(root / "benchmarks" / "bench_spark_bulk.py"), run_name="bench_spark_bulk")
    cached_before = spark.sparkContext._jsc.getPersistentRDDs().size()
    argv = ["--rows", "2000", "--runs", "1", "--raw-rows", "1000", "--batch", "500", "--redis-url", redis_url]
    assert bench["main"]([*argv, "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out.strip().splitlines()[-1])
    assert (
        summary["rows"] == 2000
        and summary["partitions"] == 2
        and summary["batch"] == 500
        and summary["master"] == "local[2]"
        and summary["median"] > 0
        and summary["raw_median"] > 0
        and summary["ratio"] > 0
    )
    assert "run 1: 2,000 rows" in out and "ratio enqueue_dataframe / raw add_bulk" in out
    # The session it found is still up and holds nothing the benchmark cached.
    assert spark.range(3).count() == 3
    assert spark.sparkContext._jsc.getPersistentRDDs().size() == cached_before
