"""Keep a daily Chasqui cron spec declared from Airflow.

The DAG upserts the spec every day (idempotent: same key, updated in place); Chasqui's
scheduler, running inside the workers, then enqueues ``daily_report`` at 06:00 Lima time
whether or not Airflow is up.  ``remove_report`` is there for tear-down runs
(trigger with ``{"remove": true}``).

The queue is the ``queue`` param, by default ``chasqui-examples`` (or ``$CHASQUI_EXAMPLES_QUEUE``
where the DAG is parsed); its workers run the scheduler, so the spec fires without Airflow.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param, task

from airflow_provider_chasqui.examples.dag_defaults import queue_param
from airflow_provider_chasqui.operators.repeatable import (
    ChasquiRemoveRepeatableOperator,
    ChasquiUpsertRepeatableOperator,
)

with DAG(
    dag_id="chasqui_daily_cron_upsert",
    schedule="@daily",
    catchup=False,
    doc_md=__doc__,
    params={
        "queue": queue_param(),
        "remove": Param(False, type="boolean"),
    },
    tags=["chasqui", "example"],
) as dag:
    upsert = ChasquiUpsertRepeatableOperator(
        task_id="upsert_report",
        job_name="daily_report",
        data={"report": "sales", "declared_by": "{{ dag.dag_id }}"},
        cron="0 6 * * *",
        tz="America/Lima",
        key="daily-sales-report",
        missed_fires="fire-once",
        attempts=5,
        queue_name="{{ params.queue }}",
    )

    @task.short_circuit
    def removing(params: dict) -> bool:
        return bool(params["remove"])

    remove = ChasquiRemoveRepeatableOperator(
        task_id="remove_report",
        key="daily-sales-report",
        queue_name="{{ params.queue }}",
    )
    upsert >> removing() >> remove
