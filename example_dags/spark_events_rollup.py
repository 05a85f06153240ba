"""Spark writes one job per row through ``format("chasqui")``; a streaming query rolls the queue's
events up into Parquet; the DAG checks that every row's job has an outcome.

1. ``generate_orders`` writes a small orders CSV (``rows`` rows: ``order_id, region, amount``;
   the first ``bad_rows`` have a negative amount, which the handler refuses) under
   ``data_dir``/``events_rollup``/<run>.
2. ``enqueue_rows``: Spark (``local[2]`` by default, the ``master`` param) reads the CSV and
   writes it with ``df.write.format("chasqui")``: one ``score_order`` job per row, the other
   columns as its data.  The ids are deterministic (``<load_id>-<partition>-<row>``, the
   ``load_id`` named after the DAG run), so a retried task writes no job twice.  Returns the
   write's load report (rows, added, skipped).
3. A ``chasqui worker`` on the queue runs ``score_order``
   (``airflow_provider_chasqui.examples.handlers``): a job completes, or is dead-lettered.
4. ``rollup_events``: a Structured Streaming query reads the queue's events
   (``spark.readStream.format("chasqui").option("what", "events")``), keeps this load's
   ``completed`` / ``dlq`` / ``failed`` events and, per micro-batch (``foreachBatch``), writes
   the per-minute counts to Parquet under ``rollup/batch_id=<N>`` (overwritten if Spark runs a
   batch again: the rollup stays exact).  It runs with ``trigger(availableNow=True)``, so each
   run ends after the events there are; the task runs it again from its checkpoint (only the
   new events) until every row's job has an outcome or ``wait_timeout_s`` has passed.
5. ``check_rollup`` reads the Parquet rollup (pyarrow, no Spark) and fails unless
   ``completed + failed`` equals the number of rows written.

Rollup columns: ``minute`` (UTC, the event's time cut to the minute), ``completed`` (jobs that
completed), ``failed`` (jobs dead-lettered: the ``dlq`` event), ``failed_attempts`` (handler
errors, retried ones included); a minute's total is the sum over its rows (one per batch).

Needs: the ``chasqui_default`` connection, a worker of the example handlers on the queue (the
``queue`` param, by default ``chasqui-examples`` or ``$CHASQUI_EXAMPLES_QUEUE``:
``chasqui worker --queue chasqui-examples --handlers airflow_provider_chasqui.examples.handlers``),
pyspark where the tasks run, and ``data_dir`` (``/tmp/chasqui-data`` or ``$CHASQUI_DATA_DIR``).
The Redis URL reaches Spark through ``CHASQUI_REDIS_URL`` in the task's environment, never as
an option (options show in query plans).
"""

from __future__ import annotations

import os
import re
from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Param, get_current_context, task

from airflow_provider_chasqui.examples.dag_defaults import DATA_DIR, queue_param

JOB_NAME = "score_order"


def _run_dir(ctx: dict) -> tuple[str, str]:
    """This run's directory under data_dir and a token of its run id (for the load id)."""
    token = re.sub(r"[^A-Za-z0-9_.-]", "_", ctx["run_id"])
    return os.path.join(ctx["params"]["data_dir"], "events_rollup", token), token


def _spark(app: str, master: str) -> Any:
    """A SparkSession for one task (stopped by the task); the Redis URL from ``chasqui_default``
    goes to the data source through the environment."""
    import sys

    from pyspark.sql import SparkSession

    from airflow_provider_chasqui.hooks.chasqui import ChasquiHook
    from airflow_provider_chasqui.spark.datasource import ENV_URL, register

    os.environ[ENV_URL] = ChasquiHook().get_settings().redis_url()
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
    )
    if master.startswith("local"):  # the Python workers: this interpreter
        builder = builder.config("spark.pyspark.python", sys.executable)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark


def rollup_totals(path: str) -> dict[str, int]:
    """The rollup's totals (sums over every row); zeros while there is none."""
    import pyarrow.parquet as pq

    totals = {"completed": 0, "failed": 0, "failed_attempts": 0, "rollup_rows": 0}
    if not os.path.isdir(path):
        return totals
    table = pq.read_table(path)
    for column in ("completed", "failed", "failed_attempts"):
        totals[column] = sum(v or 0 for v in table.column(column).to_pylist())
    totals["rollup_rows"] = table.num_rows
    return totals


with DAG(
    dag_id="chasqui_spark_events_rollup",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    params={
        "queue": queue_param(),
        "data_dir": Param(
            DATA_DIR,
            type="string",
            description="where the CSV, the rollup and the checkpoint go",
        ),
        "rows": Param(200, type="integer", minimum=1, description="orders (= jobs) to write"),
        "bad_rows": Param(
            1,
            type="integer",
            minimum=0,
            description="orders the handler refuses (dead-lettered)",
        ),
        "master": Param("local[2]", type="string", description="the Spark master of the Spark tasks"),
        "wait_timeout_s": Param(
            300,
            type="integer",
            minimum=1,
            description="how long rollup_events waits for every job's outcome",
        ),
    },
    tags=["chasqui", "example", "spark"],
) as dag:

    @task
    def generate_orders() -> dict:
        import csv
        import random

        ctx = get_current_context()
        params = ctx["params"]
        base, token = _run_dir(ctx)
        rows = int(params["rows"])
        bad = min(int(params["bad_rows"]), rows)
        os.makedirs(base, exist_ok=True)
        path = os.path.join(base, "orders.csv")
        rng = random.Random(7)
        with open(path + ".tmp", "w", newline="") as fh:
            out = csv.writer(fh)
            out.writerow(("order_id", "region", "amount"))
            for i in range(rows):
                amount = round(rng.uniform(1, 500), 2)
                out.writerow(
                    (
                        i,
                        rng.choice(("north", "south", "east", "west")),
                        -amount if i < bad else amount,
                    )
                )
        os.replace(path + ".tmp", path)
        return {
            "input": path,
            "base": base,
            "rows": rows,
            "bad_order_ids": list(range(bad)),
            "load_id": f"orders-{token}",
        }

    @task
    def enqueue_rows(dataset: dict) -> dict:
        """Spark: CSV -> one job per row.  Deterministic ids: a retry of this task (same load_id)
        finds each chunk's marker and writes nothing twice (the report then counts them skipped)."""
        from airflow_provider_chasqui.spark.datasource import ENV_URL, load_report

        params = get_current_context()["params"]
        spark = _spark("chasqui-enqueue-rows", params["master"])
        try:
            df = spark.read.csv(
                dataset["input"],
                header=True,
                schema="order_id BIGINT, region STRING, amount DOUBLE",
            )
            (
                df.write.format("chasqui")
                .option("queue", params["queue"])
                .option("name", JOB_NAME)
                .option("load_id", dataset["load_id"])
                .mode("append")
                .save()
            )
        finally:
            spark.stop()
        report = load_report(params["queue"], dataset["load_id"], redis_url=os.environ[ENV_URL])
        if not report or report.get("status") != "committed":
            raise RuntimeError(f"the write of load {dataset['load_id']} did not commit: {report}")
        print(
            f"load {dataset['load_id']}: {report['rows']} rows, {report['added']} jobs added, "
            f"{report['skipped']} skipped (written before)"
        )
        return {
            "load_id": dataset["load_id"],
            "rows": report["rows"],
            "added": report["added"],
            "skipped": report["skipped"],
        }

    @task(execution_timeout=timedelta(minutes=30))
    def rollup_events(dataset: dict, load: dict) -> dict:
        """Structured Streaming: events -> per-minute success/failure counts in Parquet."""
        import time

        from pyspark.sql import functions as F

        params = get_current_context()["params"]
        output = os.path.join(dataset["base"], "rollup")
        checkpoint = os.path.join(dataset["base"], "rollup-checkpoint")
        # the ids this load's jobs have: <load_id>-<partition>-<row>
        prefix = load["load_id"] + "-"

        def write_batch(batch: Any, batch_id: int) -> None:
            counts = batch.groupBy(F.date_trunc("minute", "ts").alias("minute")).agg(
                F.count(F.when(F.col("event") == "completed", 1)).alias("completed"),
                F.count(F.when(F.col("event") == "dlq", 1)).alias("failed"),
                F.count(F.when(F.col("event") == "failed", 1)).alias("failed_attempts"),
            )
            # one directory per micro-batch, overwritten if Spark runs the batch again
            counts.write.mode("overwrite").parquet(os.path.join(output, f"batch_id={batch_id}"))

        spark = _spark("chasqui-events-rollup", params["master"])
        deadline = time.monotonic() + int(params["wait_timeout_s"])
        runs = 0
        try:
            while True:
                events = (
                    spark.readStream.format("chasqui")
                    .option("queue", params["queue"])
                    .option("what", "events")
                    .option("start", "earliest")
                    .load()
                )
                outcomes = events.where(
                    F.col("job_id").startswith(prefix) & F.col("event").isin("completed", "dlq", "failed")
                )
                query = (
                    outcomes.writeStream.foreachBatch(write_batch)
                    .option("checkpointLocation", checkpoint)
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination()
                runs += 1
                totals = rollup_totals(output)
                done = totals["completed"] + totals["failed"]
                print(
                    f"rollup run {runs}: {done} of {load['rows']} jobs have an outcome "
                    f"({totals['completed']} completed, {totals['failed']} failed)"
                )
                if done >= load["rows"] or time.monotonic() > deadline:
                    break
                # give the workers time; the next run reads only the new events
                time.sleep(2)
        finally:
            spark.stop()
        return {"output": output, "query_runs": runs, **totals}

    @task
    def check_rollup(rollup: dict, load: dict) -> dict:
        """Trusts nothing: re-reads the Parquet rollup and compares it with the rows written."""
        totals = rollup_totals(rollup["output"])
        done = totals["completed"] + totals["failed"]
        if done != load["rows"]:
            raise ValueError(
                f"the events rollup at {rollup['output']} counts {totals['completed']} completed + "
                f"{totals['failed']} failed = {done} jobs, but {load['rows']} rows were written (load "
                f"{load['load_id']}): "
                + (
                    "is a worker running on the queue with the example handlers?"
                    if done < load["rows"]
                    else "more outcomes than jobs"
                )
            )
        summary = {"rows": load["rows"], **totals, "output": rollup["output"]}
        print(f"events rollup: {summary}")
        return summary

    dataset = generate_orders()
    load = enqueue_rows(dataset)
    check_rollup(rollup_events(dataset, load), load)
