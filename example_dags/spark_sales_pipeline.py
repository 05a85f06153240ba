"""A Spark data pipeline driven from Airflow through a Chasqui queue.

1. ``generate_sales`` writes a sales CSV (the input dataset) to a directory the Spark worker
   can read too, and returns ``{"input": csv, "output": parquet dir}``.
2. ``enqueue_rollup`` enqueues a ``sales_rollup`` job naming that dataset.
3. A Spark worker (``worker/spark.py`` under spark-submit, handlers
   ``airflow_provider_chasqui.examples.spark_handlers``) aggregates it per day and region into
   a Parquet rollup and stores the result: ``{"rows", "input_rows", "revenue", "output"}``.
4. ``wait_for_rollup``, a deferrable ``ChasquiJobSensor``, waits in the triggerer and resumes
   with that result.
5. ``check_rollup`` reads the result and the Parquet it points at.

Needs: the ``chasqui_default`` connection on the worker's Redis
(``AIRFLOW_CONN_CHASQUI_DEFAULT='{"conn_type": "chasqui", "host": "redis"}'``), a Spark worker
on the queue (the ``queue`` param, by default ``spark`` or ``$CHASQUI_SPARK_QUEUE``; see
``docker-compose.yaml``: service ``spark-worker``), and ``data_dir`` (by default
``/tmp/chasqui-data`` or ``$CHASQUI_DATA_DIR``) on storage both sides see (a shared volume; an
object store path works the same way for Spark).
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import DAG, Param, get_current_context, task

from airflow_provider_chasqui.examples.dag_defaults import DATA_DIR, SPARK_QUEUE, queue_param
from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

with DAG(
    dag_id="chasqui_spark_sales_pipeline",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    params={
        "queue": queue_param(SPARK_QUEUE, "the Spark worker"),
        "data_dir": Param(DATA_DIR, type="string", description="a directory the Spark worker reads and writes too"),
        "rows": Param(50_000, type="integer", minimum=1),
    },
    tags=["chasqui", "example", "spark"],
) as dag:

    @task
    def generate_sales() -> dict:
        from airflow_provider_chasqui.examples.spark_handlers import generate_sales_csv

        ctx = get_current_context()
        params, run = ctx["params"], ctx["run_id"].replace(":", "_").replace("+", "_")
        base = os.path.join(params["data_dir"], "sales")
        made = generate_sales_csv(os.path.join(base, f"{run}.csv"), rows=int(params["rows"]))
        return {"input": made["path"], "output": os.path.join(base, "rollups", run), "input_rows": made["rows"]}

    dataset = generate_sales()

    enqueue_rollup = ChasquiEnqueueOperator(
        task_id="enqueue_rollup",
        job_name="sales_rollup",
        data=dataset,
        queue_name="{{ params.queue }}",
        attempts=3,
    )

    wait_for_rollup = ChasquiJobSensor(
        task_id="wait_for_rollup",
        job_id=enqueue_rollup.output,
        queue_name="{{ params.queue }}",
        deferrable=True,
        timeout=timedelta(minutes=30),
    )

    @task
    def check_rollup(result: dict, dataset: dict) -> dict:
        """The downstream consumer: trusts nothing, re-reads the Parquet the worker wrote."""
        import pyarrow.parquet as pq

        table = pq.read_table(result["output"])
        if table.num_rows != result["rows"]:
            raise ValueError(f"rollup has {table.num_rows} rows, the worker reported {result['rows']}")
        if sum(table.column("orders").to_pylist()) != dataset["input_rows"]:
            raise ValueError("the rollup does not account for every input row")
        summary = {
            "rollup_rows": table.num_rows,
            "input_rows": dataset["input_rows"],
            "revenue": result["revenue"],
            "output": result["output"],
        }
        print(f"sales rollup: {summary}")
        return summary

    check_rollup(wait_for_rollup.output, dataset)
