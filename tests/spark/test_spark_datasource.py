"""``format("chasqui")`` on a real local[2] SparkSession and real Redis: rows become jobs
(decoded byte for byte), deterministic ids make re-runs and half-failed loads idempotent, the
commit report counts per partition, and bad options fail on the driver."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from typing import Any

import pytest
import redis

from airflow_provider_chasqui.core.codec import (
    decode_data,
    decode_envelope,
    split_member,
)
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(600)  # the first test pays for starting the JVM


@pytest.fixture(scope="module")
def ds(spark):
    from airflow_provider_chasqui.spark.datasource import register

    register(spark)
    return spark


def _jobs(url: str, queue: str) -> list[tuple[str, Any, str, Any]]:
    """``(name, data, job id, retry)`` of every stream entry, decoded with the wire codec."""
    out = []
    with redis.Redis.from_url(url) as r:
        for _id, fields in r.xrange(QueueKeys.for_queue(queue).stream):
            env = decode_envelope(fields[b"d"])
            out.append((fields.get(b"n", b"").decode(), decode_data(env.inner), env.id, env.retry))
    return out


def _write(df: Any, queue: str, url: str, **options: Any) -> None:
    w = df.write.format("chasqui").option("queue", queue).option("redis_url", url)
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()


def _report(queue: str, load_id: str, url: str) -> dict[str, Any]:
    from airflow_provider_chasqui.spark.datasource import load_report

    report = load_report(queue, load_id, redis_url=url)
    assert report is not None
    return report


def test_rows_become_jobs_with_deterministic_ids(ds, redis_url: str, queue_name: str) -> None:
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
            {"k": i},
        )
        for i in range(1200)
    ]
    schema = (
        "id BIGINT, kind STRING, amount DECIMAL(10,2), day DATE, at TIMESTAMP_NTZ, tags ARRAY<STRING>, "
        "info STRUCT<a: INT, b: STRING>, blob BINARY, m MAP<STRING, INT>"
    )
    df = ds.createDataFrame(rows, schema).repartition(3, "id")
    _write(df, queue_name, redis_url, name_col="kind", load_id="L1", chunk_size="100")
    jobs = _jobs(redis_url, queue_name)
    assert len(jobs) == 1200 and len({j[2] for j in jobs}) == 1200
    by_id = {data["id"]: (name, data, jid) for name, data, jid, _r in jobs}
    name, data, jid = by_id[7]
    assert name == "odd" and jid.startswith("L1-")
    assert data == {
        "id": 7,
        "amount": "7.25",
        "day": "2026-01-02",
        "at": "2026-01-01T12:07:00",
        "tags": ["t3"],
        "info": {"a": 7, "b": "7"},
        "blob": b"\x00\x01",
        "m": {"k": 7},
    }
    # ids are <load_id>-<partition>-<row in partition>: every partition counts from 0
    parts: dict[str, list[int]] = {}
    for _n, _d, jid, _r in jobs:
        _load, part, pos = jid.rsplit("-", 2)
        parts.setdefault(part, []).append(int(pos))
    assert all(sorted(p) == list(range(len(p))) for p in parts.values()) and len(parts) == 3
    report = _report(queue_name, "L1", redis_url)
    assert (report["status"], report["rows"], report["added"], report["skipped"]) == ("committed", 1200, 1200, 0)
    assert sorted(p["partition"] for p in report["partitions"]) == [0, 1, 2]
    assert sum(p["chunks"] for p in report["partitions"]) == sum(-(-len(p) // 100) for p in parts.values())

    # The same load again (a re-run Airflow task): nothing new, every row reported as written before.
    _write(df, queue_name, redis_url, name_col="kind", load_id="L1", chunk_size="100")
    assert len(_jobs(redis_url, queue_name)) == 1200
    again = _report(queue_name, "L1", redis_url)
    assert (again["added"], again["skipped"]) == (0, 1200)
    # Without a load_id every save() is a new load (its tasks' retries still deduplicate).
    _write(df.limit(10), queue_name, redis_url, name="x")
    assert len(_jobs(redis_url, queue_name)) == 1210


def test_a_half_failed_load_rerun_writes_each_row_once(ds, redis_url: str, queue_name: str) -> None:
    """A task dies after some chunks went out; the abort report says so, and the same load run
    again (the bad row fixed) writes the rest: every row exactly once."""
    from pyspark.sql import functions as F

    ds.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        base = ds.range(1000, numPartitions=1)
        bad = base.select("id", F.when(F.col("id") == 650, F.lit(None)).otherwise(F.lit("work")).alias("job"))
        with pytest.raises(
            Exception,
            match=r"(?s)a job name must be a non-empty string.*the 600 rows before it "
            r"\(6 chunks\) may have been written.*load_id='L2'",
        ):
            _write(bad, queue_name, redis_url, name_col="job", load_id="L2", chunk_size="100")
        assert len(_jobs(redis_url, queue_name)) == 600
        aborted = _report(queue_name, "L2", redis_url)
        assert aborted["status"] == "aborted" and aborted["failed_tasks"] == 1
        good = base.select("id", F.lit("work").alias("job"))
        _write(good, queue_name, redis_url, name_col="job", load_id="L2", chunk_size="100")
    finally:
        ds.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    jobs = _jobs(redis_url, queue_name)
    assert sorted(d["id"] for _n, d, _j, _r in jobs) == list(range(1000))
    done = _report(queue_name, "L2", redis_url)
    assert (done["status"], done["added"], done["skipped"]) == ("committed", 400, 600)


def test_id_column_delays_payload_column_and_retry_options(ds, redis_url: str, queue_name: str) -> None:
    df = ds.createDataFrame(
        [(f"order-{i}", (i, f"c{i}"), None if i % 2 else 60_000) for i in range(10)],
        "oid STRING, payload STRUCT<n: INT, c: STRING>, wait BIGINT",
    )
    opts = {
        "name": "ship",
        "id_col": "oid",
        "data_col": "payload",
        "delay_ms_col": "wait",
        "attempts": "4",
        "backoff": '{"kind": "exponential", "delay_ms": 500}',
    }
    for _ in range(2):  # the second load finds every id's marker
        _write(df, queue_name, redis_url, **opts)
    keys = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r:
        assert (r.xlen(keys.stream), r.zcard(keys.delayed)) == (5, 5)
        members = r.zrange(keys.delayed, 0, -1)
    jobs = _jobs(redis_url, queue_name)
    assert sorted(j for _n, _d, j, _r in jobs) == [f"order-{i}" for i in (1, 3, 5, 7, 9)]
    assert all(d == {"n": int(j.split("-")[1]), "c": f"c{j.split('-')[1]}"} for _n, d, j, _r in jobs)
    retry = jobs[0][3]
    assert retry.max_attempts == 4 and retry.backoff.kind == "exponential" and retry.backoff.delay_ms == 500
    name, env = split_member(members[0])
    assert name == "ship" and decode_envelope(env).id in {f"order-{i}" for i in (0, 2, 4, 6, 8)}


def test_timeout_option_gives_every_written_job_its_timeout(ds, redis_url: str, queue_name: str) -> None:
    """``.option("timeout_ms", ...)`` (issue 25): each job, waiting or delayed, has its own
    timeout kept beside it, and the queue is marked for the workers to read it; a rerun of the
    load writes nothing more."""
    df = ds.createDataFrame([(i, None if i % 2 else 60_000) for i in range(6)], "n INT, wait BIGINT")
    for _ in range(2):
        _write(df, queue_name, redis_url, name="t", delay_ms_col="wait", timeout_ms="2500", load_id="to-load")
    keys = QueueKeys.for_queue(queue_name)
    ids = [j for _n, _d, j, _r in _jobs(redis_url, queue_name)]
    with redis.Redis.from_url(redis_url) as r:
        delayed = [decode_envelope(split_member(m)[1]).id for m in r.zrange(keys.delayed, 0, -1)]
        assert len(ids) == len(delayed) == 3
        assert [r.get(keys.job_timeout(j)) for j in ids + delayed] == [b"2500"] * 6
        assert r.hget(keys.controls, "timeouts") == b"1"
        assert r.xlen(keys.stream) == 3


def test_run_at_column(ds, redis_url: str, queue_name: str) -> None:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    df = ds.createDataFrame([(1, later), (2, None)], "n INT, at TIMESTAMP")
    _write(df, queue_name, redis_url, name="tick", run_at_col="at")
    keys = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r:
        ((member, score),) = r.zrange(keys.delayed, 0, -1, withscores=True)
        assert r.xlen(keys.stream) == 1
    assert abs(score - later.timestamp() * 1000) < 2 and decode_data(
        decode_envelope(split_member(member)[1]).inner
    ) == {"n": 1}


def test_priority_and_group_columns_put_rows_beside_the_stream(ds, redis_url: str, queue_name: str) -> None:
    """``priority_col`` / ``group_col`` (issue 24): a row with a priority joins the prioritized
    set in row order within its priority, a row with a group its group's list and the round
    robin, a row with neither the stream; the same load run again writes nothing (its chunk
    markers); a worker then runs every job once, the plain ones first and priority 1 before 2."""
    import asyncio

    from airflow_provider_chasqui import Worker

    rows = [(i, (i % 3) + 1 if i < 12 else None, f"t{i % 2}" if 12 <= i < 20 else None) for i in range(24)]
    df = ds.createDataFrame(rows, "n INT, prio INT, tenant STRING").coalesce(1)
    for _ in range(2):
        _write(
            df, queue_name, redis_url, name="p", priority_col="prio", group_col="tenant", load_id="SIDE", chunk_size="5"
        )
    keys = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r:
        assert (r.xlen(keys.stream), r.zcard(keys.prioritized)) == (4, 12)
        assert (r.llen(keys.group_jobs("t0")), r.llen(keys.group_jobs("t1"))) == (4, 4)
        assert set(r.zrange(keys.groups, 0, -1)) == {b"t0", b"t1"}
        assert int(r.hget(keys.controls, "prio_seq")) == 12 and r.hget(keys.controls, "grouped") == b"1"
        prio_order = [
            decode_data(decode_envelope(split_member(m)[1]).inner)["n"] for m in r.zrange(keys.prioritized, 0, -1)
        ]
    assert prio_order == sorted(range(12), key=lambda i: ((i % 3) + 1, i))  # by priority, then row order
    report = _report(queue_name, "SIDE", redis_url)
    assert (report["added"], report["skipped"]) == (0, 24)  # the rerun found every chunk's marker

    ran: list[int] = []

    async def drain() -> None:
        async def handler(job: Any) -> None:
            ran.append(job.data["n"])

        w = Worker(queue_name, handler, redis_url=redis_url, concurrency=1, run_scheduler=False)
        task = asyncio.create_task(w.run())
        deadline = asyncio.get_running_loop().time() + 60
        while len(ran) < 24 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        await w.close()
        await asyncio.wait_for(task, 30)

    asyncio.run(drain())
    assert sorted(ran) == list(range(24))
    assert set(ran[:4]) == {20, 21, 22, 23}  # the plain rows first
    urgent = [n for n in ran if n < 12]
    assert urgent == prio_order  # priority 1 before 2 before 3, row order within one


def test_bad_priority_or_group_rows_fail_the_write_naming_the_row(ds, redis_url: str, queue_name: str) -> None:
    for rows, message in [
        ([(1, 0, None)], "row 0 of partition 0: priority must be between"),
        ([(1, 2, "t")], "row 0 of partition 0: a job takes a priority or a group, not both"),
        ([(1, None, "g" * 200)], "row 0 of partition 0: group must be 1 to 128 bytes"),
    ]:
        df = ds.createDataFrame(rows, "n INT, prio INT, tenant STRING").coalesce(1)
        with pytest.raises(Exception, match=message):
            _write(df, queue_name, redis_url, name="p", priority_col="prio", group_col="tenant")
    keys = QueueKeys.for_queue(queue_name)
    with redis.Redis.from_url(redis_url) as r:
        assert r.xlen(keys.stream) == 0 and r.zcard(keys.prioritized) == 0


def test_spec_rows_take_a_priority_or_a_group(ds, redis_url: str, queue_name: str) -> None:
    """kind=repeatable with ``priority_col`` / ``group_col``: each spec's fires take its row's
    option (tests/scheduler/test_sched_side_lanes.py proves the fires); a row with both is a
    bad row, reported with its key."""
    from airflow_provider_chasqui import SyncQueue

    rows = [("a", 60_000, 2, None), ("b", 60_000, None, "acme"), ("c", 60_000, None, None), ("d", 60_000, 1, "x")]
    df = ds.createDataFrame(rows, "key STRING, every BIGINT, prio INT, tenant STRING").coalesce(1)
    opts = {"kind": "repeatable", "name": "r", "key_col": "key", "every_ms_col": "every"}
    _write(df, queue_name, redis_url, priority_col="prio", group_col="tenant", on_error="skip", load_id="SS", **opts)
    report = _report(queue_name, "SS", redis_url)
    assert (report["added"], report["bad"]) == (3, 1)
    assert any("'d'" in e and "not both" in e for p in report["partitions"] for e in p["errors"])
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        got = {k: q.get_repeatable_job(k) for k in "abc"}
        assert [(got[k].priority, got[k].group) for k in "abc"] == [(2, None), (None, "acme"), (None, None)]
        assert q.get_repeatable_job("d") is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "exactly one of the options name"),
        ({"name": "x", "name_col": "k"}, "exactly one of the options name"),
        ({"name": "x", "nope": "1"}, r"unknown write options \['nope'\]"),
        ({"name_col": "n"}, r"column 'n' \(name_col\) is int; expected string"),
        ({"name": "x", "id_col": "missing"}, "option id_col='missing' is not a column"),
        ({"name": "x", "delay_ms_col": "n", "run_at_col": "n"}, "delay_ms_col or run_at_col, not both"),
        ({"name": "x", "chunk_size": "0"}, "chunk_size must be from 1 to"),
        ({"name": "x", "attempts": "-1"}, "attempts must be from 0 to"),
        ({"name": "x", "attempts": str(2**32)}, "attempts must be at most 4294967295"),  # msgpack overflowed
        (
            {"name": "x", "dedup_ttl_s": str(10**20)},
            "dedup_ttl_s must be from 1 to",
        ),  # was a PX Redis refuses, per task
        ({"name": "x", "max_stream_len": str(2**63)}, "max_stream_len must be from 1 to"),
        ({"name": "x", "backoff": "soon"}, "backoff must be ms or a JSON object"),
        ({"name": "x", "queue": "a{b}"}, "would break the"),
        ({"name": "x", "redis_url": "redis://:s3cret@"}, "not a valid Redis URL"),
        ({"name": "x", "timeout_ms": "soon"}, "timeout_ms must be a number of milliseconds"),
        ({"name": "x", "timeout_ms": "0"}, "timeout_ms must be more than 0"),
        ({"name": "x", "timeout_ms": "nan"}, "timeout_ms must be more than 0"),
        ({"name": "x", "timeout_ms": "inf"}, "timeout_ms must be more than 0"),
        ({"name": "x", "priority_col": "k"}, r"column 'k' \(priority_col\) is string; expected"),
        ({"name": "x", "group_col": "n"}, r"column 'n' \(group_col\) is int; expected string"),
        ({"name": "x", "priority_col": "n", "delay_ms_col": "n"}, "cannot be combined with delay_ms_col"),
        ({"name": "x", "group_col": "k", "id_col": "k"}, "cannot be combined with id_col"),
    ],
)
def test_bad_options(options: dict[str, str], message: str) -> None:
    """The checks ``writer()`` runs on the driver, without a Spark job per case."""
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    from airflow_provider_chasqui.errors import ConfigError
    from airflow_provider_chasqui.spark.datasource.options import write_plan

    schema = StructType([StructField("n", IntegerType()), StructField("k", StringType())])
    with pytest.raises(ConfigError, match=message) as info:
        write_plan({"queue": "q", **options}, schema)
    assert "s3cret" not in str(info.value)


def test_bad_options_fail_the_save_on_the_driver(ds, redis_url: str, queue_name: str) -> None:
    df = ds.createDataFrame([(1, "a")], "n INT, k STRING")
    with pytest.raises(Exception, match="exactly one of the options name"):
        df.write.format("chasqui").option("queue", queue_name).option("redis_url", redis_url).mode("append").save()
    with pytest.raises(Exception, match="use .mode..append"):
        df.write.format("chasqui").option("queue", queue_name).option("name", "x").mode("overwrite").save()
    with redis.Redis.from_url(redis_url) as r:
        assert r.exists(QueueKeys.for_queue(queue_name).stream) == 0


def test_batch_write_over_spark_connect(spark_connect, redis_url: str, queue_name: str) -> None:
    """The same write through a Spark Connect client: no SparkContext, accumulator or py4j."""
    from pyspark.sql import functions as F

    assert type(spark_connect).__module__.startswith("pyspark.sql.connect")
    df = spark_connect.range(3000, numPartitions=2).select("id", (F.col("id") % 3).cast("string").alias("k"))
    for _ in range(2):
        _write(df, queue_name, redis_url, name="remote", load_id="C1")
    jobs = _jobs(redis_url, queue_name)
    assert sorted(d["id"] for _n, d, _j, _r in jobs) == list(range(3000))
    assert {n for n, _d, _j, _r in jobs} == {"remote"}
    report = _report(queue_name, "C1", redis_url)
    assert (report["rows"], report["added"], report["skipped"]) == (3000, 0, 3000)
    with pytest.raises(Exception, match="exactly one of the options name"):
        df.write.format("chasqui").option("queue", queue_name).mode("append").save()
    with redis.Redis.from_url(redis_url) as r:
        for i in range(25):
            r.xadd(QueueKeys.for_queue(queue_name).events, {"e": "completed", "id": f"j{i}", "ts": 1_700_000_000_000})
    events = (
        spark_connect.read.format("chasqui")
        .option("queue", queue_name)
        .option("redis_url", redis_url)
        .option("what", "events")
        .option("partitions", "2")
        .load()
    )
    assert sorted(int(e.job_id[1:]) for e in events.collect()) == list(range(25))


def test_bulk_loaders_over_spark_connect(spark_connect, redis_url: str, queue_name: str) -> None:
    """``enqueue_dataframe`` and ``upsert_specs_dataframe`` (the thin wrappers) through a Spark
    Connect client: no SparkContext, accumulator or py4j on their path."""
    from airflow_provider_chasqui import SyncQueue
    from airflow_provider_chasqui.spark import enqueue_dataframe, upsert_specs_dataframe

    df = spark_connect.range(600, numPartitions=2).selectExpr("id", "cast(id % 3 as string) as k")
    assert enqueue_dataframe(df, queue_name, redis_url=redis_url, name="loaded") == 600
    jobs = _jobs(redis_url, queue_name)
    assert sorted(d["id"] for _n, d, _j, _r in jobs) == list(range(600))
    assert {n for n, _d, _j, _r in jobs} == {"loaded"} and len({j for _n, _d, j, _r in jobs}) == 600
    specs = spark_connect.createDataFrame(
        [(f"tenant-{i}", "0 6 * * *" if i % 2 else None, None if i % 2 else 60_000 + i, i) for i in range(40)],
        "key STRING, cron STRING, every BIGINT, n INT",
    )
    written = upsert_specs_dataframe(
        specs, queue_name, redis_url=redis_url, name="report", key_col="key", cron_col="cron", every_ms_col="every"
    )
    assert written == 40
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        metas = {m.key: m for m in q.get_repeatable_jobs(100)}
    assert sorted(metas) == sorted(f"tenant-{i}" for i in range(40))
    assert metas["tenant-1"].pattern.expression == "0 6 * * *" and metas["tenant-2"].pattern.interval_ms == 60_002


async def test_batch_reads_of_events_dlq_results_and_specs(ds, redis_url: str, queue_name: str) -> None:
    """A real Worker runs jobs (some fail into the DLQ); Spark reads what it left, in parallel ranges."""
    import json

    from airflow_provider_chasqui import SyncQueue, Worker
    from airflow_provider_chasqui.core.repeat import RepeatPattern

    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.add_bulk([{"name": "ok" if i % 3 else "boom", "data": {"i": i}, "attempts": 1} for i in range(30)])
        q.upsert_repeatable_job("tick", {"a": 1}, repeat=RepeatPattern.cron("0 6 * * *", tz="Europe/Madrid"), key="k1")
        q.upsert_repeatable_job("tock", {"a": 2}, repeat=RepeatPattern.every(60_000), key="k2")

    def ok(job: Any) -> dict[str, int]:
        return {"double": job.data["i"] * 2}

    def boom(job: Any) -> None:
        raise RuntimeError("nope")

    await Worker(
        queue_name,
        {"ok": ok, "boom": boom},
        redis_url=redis_url,
        run_scheduler=False,
        max_jobs=30,
        read_block_ms=200,
        store_results=True,
    ).run()

    def read(what: str, **options: str) -> list[Any]:
        r = ds.read.format("chasqui").option("queue", queue_name).option("redis_url", redis_url).option("what", what)
        for k, v in options.items():
            r = r.option(k, v)
        return r.load().collect()

    events = read("events", partitions="3")
    with redis.Redis.from_url(redis_url) as r:
        assert len(events) == r.xlen(QueueKeys.for_queue(queue_name).events) > 0
    assert len({e.event_id for e in events}) == len(events)
    # The Arrow batches the reader builds hold what the row-by-row decoding gives, value for value.
    from airflow_provider_chasqui.spark.datasource.reader import event_row

    def ms(row: tuple[Any, ...]) -> tuple[Any, ...]:
        return (row[0], round(row[1].timestamp() * 1000), *row[2:])

    with redis.Redis.from_url(redis_url) as r:
        expected = [
            ms(event_row(eid, [x for kv in fields.items() for x in kv]))
            for eid, fields in r.xrange(QueueKeys.for_queue(queue_name).events)
        ]
    assert sorted(ms(tuple(e)) for e in events) == sorted(expected)
    assert any(e.fields for e in events) and any(e.attempt for e in events)  # the extra fields and attempts
    assert {e.event for e in events} >= {"completed", "failed"} or {e.event for e in events} >= {"completed", "dlq"}
    assert all(isinstance(e.ts, dt.datetime) for e in events)
    dlq = read("dlq", partitions="2")
    assert sorted(json.loads(d.data)["i"] for d in dlq) == list(range(0, 30, 3))
    assert {d.name for d in dlq} == {"boom"} and all(d.job_id and d.reason for d in dlq)
    results = read("results")
    assert sorted(json.loads(x.result)["double"] for x in results) == sorted(2 * i for i in range(30) if i % 3)
    specs = {s.key: s for s in read("repeatable")}
    assert (specs["k1"].kind, specs["k1"].cron, specs["k1"].tz, json.loads(specs["k1"].data)) == (
        "cron",
        "0 6 * * *",
        "Europe/Madrid",
        {"a": 1},
    )
    assert (specs["k2"].kind, specs["k2"].every_ms, specs["k2"].paused) == ("every", 60_000, False)
    assert specs["k1"].next_fire > dt.datetime.now() - dt.timedelta(days=1)
    ticks = (
        ds.read.format("chasqui")
        .option("queue", queue_name)
        .option("redis_url", redis_url)
        .option("what", "repeatable")
        .load()
        .filter("name = 'tick'")
        .collect()
    )  # pushed: read-side
    assert [s.key for s in ticks] == ["k1"]
    with pytest.raises(Exception, match="option what must be one of"):
        read("nothing")


def _stream_query(spark: Any, src: str, checkpoint: str, queue: str, url: str) -> Any:
    return (
        spark.readStream.schema("id BIGINT")
        .option("maxFilesPerTrigger", 1)
        .parquet(src)
        .writeStream.format("chasqui")
        .option("queue", queue)
        .option("redis_url", url)
        .option("name", "row")
        .option("load_id", "S1")
        .option("chunk_size", 25)
        .option("checkpointLocation", checkpoint)
    )


@pytest.mark.slow  # its own Spark JVM: about a minute more than the rest of the module
def test_streaming_write_is_exactly_once_across_a_killed_spark_process(
    ds, redis_url: str, queue_name: str, tmp_path
) -> None:
    """A streaming query in its own Spark process is SIGKILLed while it writes; the query restarted
    from its checkpoint (here, in another Spark) replays the unfinished micro-batch: each row's job
    is in the queue exactly once."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    files, per_file = 6, 1000
    src, checkpoint = str(tmp_path / "src"), str(tmp_path / "checkpoint")
    for i in range(files):
        ds.range(i * per_file, (i + 1) * per_file, numPartitions=2).write.mode("append").parquet(src)
    stream = QueueKeys.for_queue(queue_name).stream
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_CONNECT", "SPARK_REMOTE"))}
    env.update(
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
    )
    log = tmp_path / "stream_proc.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("stream_proc.py")),
                src,
                checkpoint,
                queue_name,
                redis_url,
                "S1",
            ],
            env=env,
            start_new_session=True,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    r = redis.Redis.from_url(redis_url)
    try:
        deadline = time.monotonic() + 400
        while r.xlen(stream) < 1.5 * per_file:  # inside the second micro-batch, most likely
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the streaming query wrote too little in 400 s"
            time.sleep(0.05)
    finally:
        try:  # the whole group: the Python driver and its JVM
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
    at_kill = r.xlen(stream)
    assert at_kill < files * per_file
    query = _stream_query(ds, src, checkpoint, queue_name, redis_url).trigger(availableNow=True).start()
    assert query.awaitTermination(400)
    assert query.exception() is None
    jobs = _jobs(redis_url, queue_name)
    assert sorted(d["id"] for _n, d, _j, _r in jobs) == list(range(files * per_file))
    assert len({j for _n, _d, j, _r in jobs}) == files * per_file
    skipped = sum(
        json.loads(r.get(k))["skipped"] for k in r.scan_iter(match="{chasqui:" + queue_name + "}:spark:load:S1.*")
    )
    print(f"killed at {at_kill} jobs; rows the restart found written before: {skipped}")
    r.close()


def test_streaming_write_replays_an_uncommitted_micro_batch_once(ds, redis_url: str, queue_name: str, tmp_path) -> None:
    """A crash between the sink's write and Spark's commit of micro-batch N leaves its offsets
    logged and its commit missing; the restarted query runs batch N again (same id, same rows),
    and the sink writes nothing twice.  The crash is staged by deleting the last commit file."""
    from pathlib import Path

    src, checkpoint = str(tmp_path / "src"), tmp_path / "checkpoint"
    for i in range(3):
        ds.range(i * 400, (i + 1) * 400, numPartitions=2).write.mode("append").parquet(src)
    query = _stream_query(ds, src, str(checkpoint), queue_name, redis_url).trigger(availableNow=True).start()
    assert query.awaitTermination(300) and query.exception() is None
    assert len(_jobs(redis_url, queue_name)) == 1200
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    Path(checkpoint / "commits" / str(last)).unlink()
    for crc in (checkpoint / "commits").glob(f".{last}.crc"):
        crc.unlink()
    ds.range(1200, 1600, numPartitions=2).write.mode("append").parquet(src)
    query = _stream_query(ds, src, str(checkpoint), queue_name, redis_url).trigger(availableNow=True).start()
    assert query.awaitTermination(300) and query.exception() is None
    jobs = _jobs(redis_url, queue_name)
    assert sorted(d["id"] for _n, d, _j, _r in jobs) == list(range(1600))
    from airflow_provider_chasqui.spark.datasource import load_report

    replayed = load_report(queue_name, f"S1.{last}", redis_url=redis_url)
    assert replayed is not None and replayed["rows"] > 0
    assert (replayed["added"], replayed["skipped"]) == (0, replayed["rows"])  # the replay wrote nothing again


def test_streaming_read_of_events(ds, redis_url: str, queue_name: str, tmp_path) -> None:
    """readStream follows the events stream: offsets are stream ids, a later run sees only new events."""
    events = QueueKeys.for_queue(queue_name).events
    r = redis.Redis.from_url(redis_url)
    for i in range(40):
        r.xadd(events, {"e": "completed", "id": f"j{i}", "ts": 1_700_000_000_000 + i, "n": "x"})
    table = "ev_" + queue_name.replace("-", "_")
    query = (
        ds.readStream.format("chasqui")
        .option("queue", queue_name)
        .option("redis_url", redis_url)
        .option("what", "events")
        .load()
        .writeStream.format("memory")
        .queryName(table)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    try:
        query.processAllAvailable()
        assert ds.sql(f"select count(*) from {table}").collect()[0][0] == 40
        for i in range(40, 55):
            r.xadd(events, {"e": "failed", "id": f"j{i}", "ts": 1_700_000_000_000 + i, "n": "x", "attempt": "2"})
        query.processAllAvailable()
        rows = ds.sql(f"select job_id, event, attempt, ts from {table}").collect()
        assert sorted(int(x.job_id[1:]) for x in rows) == list(range(55))
        assert {x.event for x in rows if x.attempt == 2} == {"failed"}
    finally:
        query.stop()
        r.close()


def test_streaming_read_of_events_with_trigger_available_now(ds, redis_url: str, queue_name: str, tmp_path) -> None:
    """``trigger(availableNow=True)`` is supported (no fallback to one batch): a run reads the
    events there were when it started and stops; a later run from the checkpoint reads only the
    new ones.  The reader alone: after prepareForTriggerAvailableNow it never goes past that id."""
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from airflow_provider_chasqui.spark.datasource.reader import read_plan
    from airflow_provider_chasqui.spark.datasource.stream import ChasquiStreamReader

    events = QueueKeys.for_queue(queue_name).events
    r = redis.Redis.from_url(redis_url)
    try:
        ids = [
            r.xadd(events, {"e": "completed", "id": f"j{i}", "ts": 1_700_000_000_000 + i, "n": "x"}).decode()
            for i in range(30)
        ]
        reader = ChasquiStreamReader(read_plan({"queue": queue_name, "redis_url": redis_url}))
        assert isinstance(reader, SupportsTriggerAvailableNow)
        reader.prepareForTriggerAvailableNow()
        r.xadd(events, {"e": "completed", "id": "late", "ts": 1_700_000_000_100, "n": "x"})
        assert reader.latestOffset({"id": "0-0", "seq": 0})["id"] == ids[-1]  # not the late one
        reached = {"id": ids[-1], "seq": 30}
        assert reader.latestOffset(reached) == reached  # reached: no more data

        def run() -> list[str]:
            seen: list[str] = []
            query = (
                ds.readStream.format("chasqui")
                .option("queue", queue_name)
                .option("redis_url", redis_url)
                .option("what", "events")
                .load()
                .writeStream.foreachBatch(lambda df, _n: seen.extend(x.job_id for x in df.collect()))
                .option("checkpointLocation", str(tmp_path / "ck"))
                .trigger(availableNow=True)
                .start()
            )
            assert query.awaitTermination(300), "the availableNow query did not stop"
            return seen

        assert sorted(run()) == sorted([f"j{i}" for i in range(30)] + ["late"])
        for i in range(31, 40):
            r.xadd(events, {"e": "dlq", "id": f"j{i}", "ts": 1_700_000_000_200 + i, "n": "x"})
        assert run() == [f"j{i}" for i in range(31, 40)]  # from the checkpoint: the new events only
    finally:
        r.close()


def test_chunk_and_id_marker_scripts(redis_url: str, queue_name: str) -> None:
    """The two scripts under the writer, alone: a chunk's marker makes its second call a no-op
    (-1), per-id markers suppress only the ids already added; delayed members go to the ZSET."""
    from airflow_provider_chasqui.core.calls import script_call
    from airflow_provider_chasqui.core.codec import encode_member, encode_new_envelope
    from airflow_provider_chasqui.sync._driver import SyncDriver

    k = QueueKeys.for_queue(queue_name)
    env = [encode_new_envelope(f"j{i}", b"\x80", 1) for i in range(3)]
    member = encode_member(b"late", env[2])
    driver = SyncDriver(redis_url)
    try:
        once = script_call(
            "enqueue_batch_once",
            (k.stream, k.delayed, k.unique("spark:L:0:0")),
            (60_000, 1000, 0, env[0], b"a", 0, env[1], b"", 99, member, b"late"),
        )
        assert driver.call(once) == 3 and driver.call(once) == -1
        unique = script_call(
            "enqueue_batch_unique",
            (k.stream, k.delayed, k.unique("x"), k.unique("y")),
            (60_000, 1000, "x", 0, env[0], b"a", "y", 0, env[1], b"a"),
        )
        assert (
            driver.call(
                script_call(
                    "enqueue_batch_unique", (k.stream, k.delayed, k.unique("x")), (60_000, 1000, "x", 0, env[0], b"a")
                )
            )
            == 1
        )
        assert driver.call(unique) == 1  # x held by the call before, y new
    finally:
        driver.close()
    with redis.Redis.from_url(redis_url) as r:
        assert (r.xlen(k.stream), r.zrange(k.delayed, 0, -1, withscores=True)) == (4, [(member, 99.0)])
        assert 0 < r.pttl(k.unique("spark:L:0:0")) <= 60_000 and r.get(k.unique("y")) == b"y"


def test_spec_upserts_report_bad_rows(ds, redis_url: str, queue_name: str) -> None:
    """kind=repeatable: rows become specs through the bulk upsert; bad rows fail the write with
    their row and key, or (on_error=skip) are counted and listed in the report."""
    from airflow_provider_chasqui import SyncQueue

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
    rows[7] = ("tenant-7", "report", "61 * * * *", None, None, 7)  # invalid cron
    rows[9] = ("tenant-9", "report", "0 6 * * *", "Mars/Base", None, 9)  # unknown zone
    df = ds.createDataFrame(rows, "key STRING, job STRING, cron STRING, tz STRING, every BIGINT, tenant INT")
    opts = {
        "kind": "repeatable",
        "name_col": "job",
        "key_col": "key",
        "cron_col": "cron",
        "tz_col": "tz",
        "every_ms_col": "every",
        "data_cols": "tenant",
        "attempts": "3",
    }
    with pytest.raises(Exception, match=r"row 7 \(key 'tenant-7'\)"):
        _write(df.coalesce(1), queue_name, redis_url, **opts)
    _write(df.repartition(2), queue_name, redis_url, on_error="skip", load_id="SP", **opts)
    report = _report(queue_name, "SP", redis_url)
    assert (report["rows"], report["added"], report["bad"]) == (40, 38, 2)
    errors = [e for p in report["partitions"] for e in p["errors"]]
    assert any("tenant-7" in e for e in errors) and any("tenant-9" in e and "Mars/Base" in e for e in errors)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        assert len(q.get_repeatable_jobs(limit=100)) == 38
        spec = q.get_repeatable_job("tenant-4")
        assert spec is not None and spec.data == {"tenant": 4} and spec.attempts == 3
        assert q.get_repeatable_job("tenant-7") is None


def _pushdown_fixture(url: str, queue: str, base: int) -> None:
    """100 dlq entries and 100 events one second apart from ``base`` (explicit stream ids), the
    events' ``ts`` up to two minutes off their ids (worker clock vs Redis clock), and 100 stored
    results scored one second apart."""
    from airflow_provider_chasqui.core.codec import encode_data, encode_new_envelope

    k = QueueKeys.for_queue(queue)
    with redis.Redis.from_url(url) as r:
        pipe = r.pipeline(transaction=False)
        for i in range(100):
            ms = base + i * 1000
            env = encode_new_envelope(f"d{i}", encode_data({"i": i}), ms)
            pipe.xadd(k.dlq, {"d": env, "n": "a" if i % 2 else "b", "reason": "retries-exhausted"}, id=f"{ms}-0")
            pipe.xadd(
                k.events,
                {
                    "e": "completed" if i % 3 else "failed",
                    "id": f"e{i}",
                    "n": "a" if i % 2 else "b",
                    "ts": ms + (i % 5 - 2) * 60_000,
                },
                id=f"{ms}-0",
            )
            pipe.zadd(k.results, {f"r{i}": ms})
            pipe.set(k.result(f"r{i}"), encode_data({"i": i}))
        pipe.execute()


def test_batch_reads_push_time_and_name_filters_down(ds, redis_url: str, queue_name: str) -> None:
    """Time-range and name filters give the same rows with Spark's pushdown on and off; with it
    on, the planned XRANGE bounds / result ranks cover only the range asked for and Spark's own
    Filter keeps only what the source could not do."""
    from pyspark.sql import functions as F

    from airflow_provider_chasqui.spark.datasource import PUSHDOWN_CONF

    base = 1_750_000_000_000
    _pushdown_fixture(redis_url, queue_name, base)

    def at(i: int) -> dt.datetime:
        return dt.datetime.fromtimestamp((base + i * 1000) / 1000, dt.UTC)

    def read(what: str) -> Any:
        return (
            ds.read.format("chasqui")
            .option("queue", queue_name)
            .option("redis_url", redis_url)
            .option("what", what)
            .option("partitions", "3")
            .load()
        )

    cases = [
        ("dlq", (F.col("ts") >= at(10)) & (F.col("ts") < at(20)), 10),
        ("dlq", (F.col("ts") > at(10)) & (F.col("ts") <= at(20)) & (F.col("name") == "a"), 5),
        ("dlq", F.col("name").isin("a", "zz") & (F.col("ts") == at(41)), 1),
        ("dlq", (F.col("name") == "a") | (F.col("ts") < at(3)), 52),  # an OR: not pushed, Spark filters
        ("events", (F.col("ts") >= at(30)) & (F.col("ts") < at(60)), None),
        ("events", F.col("event").isin("failed") & (F.col("name") == "b"), 17),
        ("results", (F.col("stored_at") >= at(90)), 10),
        ("results", (F.col("stored_at") > at(5)) & (F.col("stored_at") < at(8)), 2),
    ]
    plans: list[str] = []
    for pushdown in ("true", "false"):
        ds.conf.set(PUSHDOWN_CONF, pushdown)
        try:
            got = []
            for what, cond, _n in cases:
                frame = read(what).filter(cond)
                got.append(sorted(tuple(r) for r in frame.collect()))
                if pushdown == "true" and what == "dlq":
                    plans.append(frame._jdf.queryExecution().executedPlan().toString())
        finally:
            ds.conf.set(PUSHDOWN_CONF, "true")
        if pushdown == "true":
            pushed_rows = got
        else:
            assert got == pushed_rows  # pushdown changes nothing in the result
    # events: ts up to 2 minutes off the id, all found through the bounds widened by ts_slack_ms
    in_range = sum(1 for i in range(100) if 30_000 <= i * 1000 + (i % 5 - 2) * 60_000 < 60_000)
    for (what, _c, n), rows in zip(cases, pushed_rows):
        assert len(rows) == (in_range if n is None else n), (what, n, len(rows))
    # Spark's own Filter above the scan keeps only IS NOT NULL checks for the pushed cases; the OR stays.
    for plan in plans[:3]:
        above = plan.split("BatchScan")[0]
        assert not any(op in above for op in (" >= ", " <= ", " > ", " < ", " = ", " IN (")), plan
    assert " OR " in plans[3].split("BatchScan")[0]

    # What the pushdown plans to fetch, on the driver (the same reader Spark gets).
    from pyspark.sql.datasource import (
        EqualTo,
        GreaterThan,
        GreaterThanOrEqual,
        In,
        IsNotNull,
        LessThan,
    )

    from airflow_provider_chasqui.spark.datasource.reader import (
        ChasquiFilteringReader,
        RankRange,
        StreamRange,
        read_plan,
    )

    def planned(what: str, filters: list[Any], **options: str) -> tuple[Any, list[Any], list[Any]]:
        reader = ChasquiFilteringReader(
            read_plan({"queue": queue_name, "redis_url": redis_url, "what": what, "partitions": "3", **options})
        )
        left = list(reader.pushFilters(filters))
        return reader, left, reader.partitions()

    k = QueueKeys.for_queue(queue_name)
    keep = IsNotNull(("ts",))
    reader, left, parts = planned(
        "dlq", [GreaterThanOrEqual(("ts",), at(10)), LessThan(("ts",), at(20)), EqualTo(("name",), "a"), keep]
    )
    assert left == [keep]  # by reference: the one filter Spark still applies
    with redis.Redis.from_url(redis_url) as r:
        fetched = [e for p in parts if isinstance(p, StreamRange) for e in r.xrange(k.dlq, p.start, p.end)]
        assert len(fetched) == 10 and len(parts) <= 3  # 10 of the 100 entries are fetched at all
        rows = [row for p in parts for row in reader.read(p)]
        assert sorted(int(row[0].split("-")[0]) for row in rows) == [base + i * 1000 for i in range(11, 20, 2)]
        # events: ts filters widen by ts_slack_ms and go back to Spark; names and kinds are read-side
        ts_filter = GreaterThan(("ts",), at(50))
        reader, left, parts = planned("events", [ts_filter, In(("event",), ("failed",))], ts_slack_ms="10000")
        assert left == [ts_filter]
        fetched = [e for p in parts for e in r.xrange(k.events, p.start, p.end)]
        assert len(fetched) == 59  # ids from 50 s + 1 ms - 10 s on: entries 41..99
        rows = [row for p in parts for row in reader.read(p)]
        assert {row[2] for row in rows} == {"failed"} and len(rows) == sum(1 for i in range(41, 100) if i % 3 == 0)
        reader, left, parts = planned("results", [GreaterThanOrEqual(("stored_at",), at(95))])
        ranks = [n for p in parts if isinstance(p, RankRange) for n in range(p.lo, p.hi + 1)]
        assert left == [] and ranks == [95, 96, 97, 98, 99]  # the 5 newest of 100 results
        assert sorted(json.loads(row[2])["i"] for p in parts for row in reader.read(p)) == [95, 96, 97, 98, 99]
        reader, left, parts = planned("dlq", [EqualTo(("ts",), at(5)), LessThan(("ts",), at(5))])
        assert left == [] and [row for p in parts for row in reader.read(p)] == []  # an empty range: no XRANGE


def test_spec_upserts_and_streaming_write_over_spark_connect(
    spark_connect, redis_url: str, queue_name: str, tmp_path
) -> None:
    """kind=repeatable and the streaming sink through a Spark Connect client: specs (a bad row
    skipped and reported), and a streaming query run twice from one checkpoint (each row once)."""
    from airflow_provider_chasqui import SyncQueue
    from airflow_provider_chasqui.spark.datasource import load_report

    rows = [(f"c-{i}", "0 6 * * *" if i % 2 else None, None if i % 2 else 30_000, i) for i in range(6)]
    rows[3] = ("c-3", "0 25 * * *", None, 3)  # invalid cron
    specs = spark_connect.createDataFrame(rows, "key STRING, cron STRING, every BIGINT, n INT")
    _write(
        specs,
        queue_name,
        redis_url,
        kind="repeatable",
        name="tick",
        key_col="key",
        cron_col="cron",
        every_ms_col="every",
        data_cols="n",
        on_error="skip",
        load_id="CS",
    )
    report = _report(queue_name, "CS", redis_url)
    assert (report["rows"], report["added"], report["bad"]) == (6, 5, 1)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        assert sorted(s.key for s in q.get_repeatable_jobs(limit=100)) == ["c-0", "c-1", "c-2", "c-4", "c-5"]
        assert q.get_repeatable_job("c-2").data == {"n": 2}

    src, checkpoint = str(tmp_path / "src"), str(tmp_path / "checkpoint")
    spark_connect.range(0, 300, numPartitions=2).write.mode("append").parquet(src)

    def run() -> None:
        query = _stream_query(spark_connect, src, checkpoint, queue_name, redis_url).trigger(availableNow=True).start()
        assert query.awaitTermination(300)
        assert query.exception() is None

    run()
    spark_connect.range(300, 500, numPartitions=2).write.mode("append").parquet(src)
    run()  # restarted from the checkpoint: only the new file
    jobs = _jobs(redis_url, queue_name)
    assert sorted(d["id"] for _n, d, _j, _r in jobs) == list(range(500))
    assert len({j for _n, _d, j, _r in jobs}) == 500
    batch0 = load_report(queue_name, "S1.0", redis_url=redis_url)  # one parquet file per micro-batch
    assert batch0 is not None and (batch0["status"], batch0["rows"], batch0["added"]) == ("committed", 150, 150)


def test_streaming_read_reports_a_trimmed_range(ds, redis_url: str, queue_name: str, tmp_path) -> None:
    """Events trimmed (XTRIM MINID) between two micro-batches, past the last committed offset:
    the next batch fails naming the queue and the lost id range; restarted from the same
    checkpoint with on_trim=skip, the query goes on with what is left, each row once."""
    events = QueueKeys.for_queue(queue_name).events
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "ck")
    r = redis.Redis.from_url(redis_url)

    def add(lo: int, hi: int) -> list[str]:
        return [
            r.xadd(events, {"e": "completed", "id": f"j{i}", "ts": 1_700_000_000_000 + i, "n": "x"}).decode()
            for i in range(lo, hi)
        ]

    def start(on_trim: str) -> Any:
        return (
            ds.readStream.format("chasqui")
            .option("queue", queue_name)
            .option("redis_url", redis_url)
            .option("what", "events")
            .option("on_trim", on_trim)
            .load()
            .writeStream.format("parquet")
            .option("path", out)
            .option("checkpointLocation", checkpoint)
            .start()
        )

    read = add(0, 40)
    query = start("fail")
    try:
        query.processAllAvailable()
        assert ds.read.parquet(out).count() == 40
        # j40..j69 added and j0..j49 trimmed in one transaction, so the running query cannot read
        # any of j40..j49 first: they are lost unread
        base = int(read[-1].split("-")[0]) + 1
        later = [f"{base}-{i}" for i in range(30)]
        pipe = r.pipeline(transaction=True)
        for i, eid in enumerate(later):
            pipe.xadd(events, {"e": "completed", "id": f"j{40 + i}", "ts": 1_700_000_000_040 + i, "n": "x"}, id=eid)
        pipe.xtrim(events, minid=later[10], approximate=False)
        pipe.execute()
        with pytest.raises(
            Exception,
            match=(
                rf"(?s)up to 10 event\(s\) of queue '{queue_name}' in the id range "
                rf"\({read[-1]}, {later[10]}\) were trimmed.*on_trim.*skip"
            ),
        ):
            query.processAllAvailable()
    finally:
        query.stop()
    assert ds.read.parquet(out).count() == 40  # nothing silently skipped
    query = start("skip")
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert query.exception() is None
    ids = sorted(int(row.job_id[1:]) for row in ds.read.parquet(out).collect())
    assert ids == list(range(40)) + list(range(50, 70))
    r.close()


def test_filtered_reads_and_read_stream_over_spark_connect(spark_connect, redis_url: str, queue_name: str) -> None:
    """Over Spark Connect: register() turned pushdown on for the session, a time- and name-filtered
    dlq read gives the rows asked for, and readStream follows the events stream."""
    from pyspark.sql import functions as F

    from airflow_provider_chasqui.spark.datasource import PUSHDOWN_CONF

    assert spark_connect.conf.get(PUSHDOWN_CONF) == "true"
    base = 1_750_000_000_000
    _pushdown_fixture(redis_url, queue_name, base)
    at = dt.datetime.fromtimestamp((base + 10_000) / 1000, dt.UTC)
    dead = (
        spark_connect.read.format("chasqui")
        .option("queue", queue_name)
        .option("redis_url", redis_url)
        .option("what", "dlq")
        .load()
        .filter((F.col("ts") < at) & (F.col("name") == "a"))
    )
    assert sorted(int(d.dlq_id.split("-")[0]) for d in dead.collect()) == [base + i * 1000 for i in range(1, 10, 2)]
    table = "cev_" + queue_name.replace("-", "_")
    query = (
        spark_connect.readStream.format("chasqui")
        .option("queue", queue_name)
        .option("redis_url", redis_url)
        .option("what", "events")
        .load()
        .writeStream.format("memory")
        .queryName(table)
        .start()
    )
    try:
        query.processAllAvailable()
        assert spark_connect.sql(f"select count(*) from {table}").collect()[0][0] == 100
    finally:
        query.stop()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ts_slack_ms": "-1"}, "ts_slack_ms must be from 0 to"),
        ({"ts_slack_ms": str(10**12)}, "ts_slack_ms must be from 0 to"),
        ({"partitions": str(10**9)}, "partitions must be at most 10,000"),  # was a billion tasks planned
        ({"page": str(10**7)}, "page must be at most 100,000"),
        ({"ts_slack_ms": "soon"}, "must be integers"),
        ({"on_trim": "ignore"}, "on_trim must be fail or skip"),
        ({"what": "jobs"}, "option what must be one of"),
        ({"nope": "1"}, r"unknown read options \['nope'\]"),
    ],
)
def test_bad_read_options(options: dict[str, str], message: str) -> None:
    from airflow_provider_chasqui.errors import ConfigError
    from airflow_provider_chasqui.spark.datasource.reader import read_plan

    with pytest.raises(ConfigError, match=message):
        read_plan({"queue": "q", **options})


@pytest.mark.timeout(300)
def test_register_names_a_worker_python_without_the_package(tmp_path) -> None:
    """Issue 28: ``python job.py`` from a venv, with Spark's workers on another interpreter
    (here Debian's /usr/bin/python3, which has neither pyspark nor this package): register()
    says what to set, instead of a ModuleNotFoundError deep in the first job's traceback."""
    import os
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text(
        "from pyspark.sql import SparkSession\n"
        "from airflow_provider_chasqui.errors import ConfigError\n"
        "from airflow_provider_chasqui.spark.datasource import register\n"
        "spark = SparkSession.builder.master('local[1]').config('spark.ui.enabled', 'false').getOrCreate()\n"
        "try:\n"
        "    register(spark)\n"
        "    print('REGISTERED')\n"
        "except ConfigError as exc:\n"
        "    print('CONFIG ERROR:', exc)\n"
        "spark.stop()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the package as installed, nowhere else
    env.update(PYSPARK_PYTHON="/usr/bin/python3", SPARK_LOCAL_IP="127.0.0.1")
    out = subprocess.run(  # from a directory outside the checkout, as a user's job runs
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert "CONFIG ERROR: Spark runs its Python workers with '/usr/bin/python3'" in out.stdout, out.stdout + out.stderr
    assert f"set PYSPARK_PYTHON={sys.executable}" in out.stdout
    env["PYSPARK_PYTHON"] = sys.executable
    ok = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path
    )
    assert "REGISTERED" in ok.stdout, ok.stdout + ok.stderr


def test_streaming_read_fails_when_the_events_stream_goes_back(ds, redis_url: str, queue_name: str, tmp_path) -> None:
    """An entry at the largest id is read (the query's offset is that id), then the events
    stream is deleted and written again, every new id below the offset: the query stopped
    reading, silently, for good.  It now fails naming the queue, both ids and what to do."""
    from airflow_provider_chasqui.core.event_follow import LAST_STREAM_ID

    events = QueueKeys.for_queue(queue_name).events
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "ck")
    r = redis.Redis.from_url(redis_url)
    for i in range(3):
        r.xadd(events, {"e": "completed", "id": f"j{i}", "ts": 1_700_000_000_000 + i, "n": "x"})
    r.xadd(events, {"e": "completed", "id": "junk", "ts": 1, "n": "x"}, id=LAST_STREAM_ID)
    query = (
        ds.readStream.format("chasqui")
        .option("queue", queue_name)
        .option("redis_url", redis_url)
        .option("what", "events")
        .load()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    try:
        query.processAllAvailable()
        assert sorted(row.job_id for row in ds.read.parquet(out).collect()) == ["j0", "j1", "j2", "junk"]
        r.delete(events)
        new = r.xadd(events, {"e": "completed", "id": "j3", "ts": 1_700_000_000_003, "n": "x"}).decode()
        with pytest.raises(
            Exception,
            match=rf"(?s)events stream of queue '{queue_name}' now ends at {new}, before this query's offset "
            rf"{LAST_STREAM_ID}.*new checkpoint",
        ):
            query.processAllAvailable()
    finally:
        query.stop()
        r.close()
