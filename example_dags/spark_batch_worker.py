"""Start a batch-mode Chasqui Spark worker from Airflow with the Spark provider's ``SparkSubmitHook``.

The task runs ``spark-submit <.../worker/spark.py> --queue Q --handlers ... --max-jobs N
--idle-exit S``: the worker drains the queue with one SparkSession and exits 0 after ``N``
jobs or after ``S`` seconds with nothing to do, so the task ends when the backlog is done.
Pair it with producers that enqueue a batch first (``seed_batch`` here does), or schedule it
after an upstream bulk load.  The queue is the ``queue`` param, by default ``spark-batch`` (or
``$CHASQUI_SPARK_BATCH_QUEUE``): no long-running worker should consume it, so this worker gets
the whole batch.  The worker runs its Spark jobs in the FAIR pools of the scheduler allocation
file it ships and logs Spark at WARN (``--spark-conf spark.log.level=INFO`` for more).

Needs the ``spark_default`` connection (``conn_type`` spark; host = the master, e.g.
``local[2]``, ``spark://host:7077`` or ``k8s://...``), ``spark-submit`` on the Airflow
worker's PATH (full ``pyspark``, not only ``pyspark-client``), this package installed where
the Spark driver runs, and ``chasqui_default`` for the enqueue.

The worker finds Redis through ``CHASQUI_REDIS_URL`` in spark-submit's environment, set by
``drain_with_spark`` from the ``conn_id`` connection it resolves itself: a task reads any
connection (made in the UI, with ``airflow connections add``, ``AIRFLOW_CONN_*`` or a secrets
backend) through the Task SDK, while the processes a task starts cannot (Airflow 3 blocks the
metadata database for them), so ``spark-submit ... --conn-id`` would not find a UI-made
connection.  The URL (and so a password) goes neither into spark-submit's argv (visible to every
user of the machine and in the Spark UI) nor into a templated field (stored as the task's
rendered fields).  The environment reaches the driver in client deploy mode (the default);
in cluster mode give the driver ``CHASQUI_REDIS_URL`` from a secret instead (e.g.
``spark.kubernetes.driver.secretKeyRef.CHASQUI_REDIS_URL``).
"""

from __future__ import annotations

import os
from datetime import timedelta

from airflow.sdk import DAG, Param, get_current_context, task

from airflow_provider_chasqui.examples.dag_defaults import DATA_DIR, SPARK_BATCH_QUEUE, queue_param
from airflow_provider_chasqui.worker import spark as spark_worker

# The entry file's path, found from the installed package (importing the module is cheap:
# it imports pyspark only inside main()).
SPARK_WORKER_ENTRY = spark_worker.__file__

with DAG(
    dag_id="chasqui_spark_batch_worker",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    params={
        "queue": queue_param(SPARK_BATCH_QUEUE, "the batch Spark worker started here"),
        "conn_id": Param(
            "chasqui_default", type="string", description="the chasqui connection the Spark driver reads Redis from"
        ),
        "data_dir": Param(DATA_DIR, type="string"),
        "datasets": Param(3, type="integer", minimum=1, description="how many rollup jobs to seed"),
        "max_jobs": Param(100, type="integer", minimum=1),
        "idle_exit_secs": Param(20, type="integer", minimum=1),
    },
    tags=["chasqui", "example", "spark"],
) as dag:

    @task
    def seed_batch() -> list[str]:
        """Enqueue one ``sales_rollup`` job per generated dataset (the backlog the worker drains)."""
        from airflow_provider_chasqui.examples.spark_handlers import generate_sales_csv
        from airflow_provider_chasqui.hooks.chasqui import ChasquiHook

        ctx = get_current_context()
        params, run = ctx["params"], ctx["run_id"].replace(":", "_").replace("+", "_")
        jobs = []
        for i in range(int(params["datasets"])):
            base = os.path.join(params["data_dir"], "batch", run)
            made = generate_sales_csv(os.path.join(base, f"sales-{i}.csv"), rows=5_000, seed=i)
            jobs.append(
                {"name": "sales_rollup", "data": {"input": made["path"], "output": os.path.join(base, f"rollup-{i}")}}
            )
        with ChasquiHook().get_queue(params["queue"]) as queue:
            return [job.id for job in queue.add_bulk(jobs)]

    @task(execution_timeout=timedelta(hours=2))
    def drain_with_spark() -> None:
        """spark-submit the batch worker, Redis's URL in its environment only (see the DAG's doc)."""
        from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

        from airflow_provider_chasqui.hooks.chasqui import ChasquiHook

        params = get_current_context()["params"]
        redis_url = ChasquiHook(params["conn_id"]).get_settings().redis_url()  # the Task SDK's lookup
        hook = SparkSubmitHook(
            conn_id="spark_default",
            name="chasqui-batch-worker",
            conf={"spark.ui.enabled": "false"},
            application_args=[
                "--queue",
                params["queue"],
                "--handlers",
                "airflow_provider_chasqui.examples.spark_handlers",
                "--max-jobs",
                str(params["max_jobs"]),
                "--idle-exit",
                str(params["idle_exit_secs"]),
                "--no-scheduler",
            ],
        )
        try:
            hook.submit(SPARK_WORKER_ENTRY, env={**os.environ, "CHASQUI_REDIS_URL": redis_url})
        except BaseException:
            hook.on_kill()  # a task killed or timed out: spark-submit (and its driver) must not outlive it
            raise

    seed_batch() >> drain_with_spark()
