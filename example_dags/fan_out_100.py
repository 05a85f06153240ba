"""Fan out 100 Chasqui jobs in one round trip and wait for all of them with one sensor.

``fan_out`` enqueues with ``add_bulk`` through ``ChasquiHook`` and returns the ids; the
deferrable ``ChasquiJobSensor`` waits for all of them in the triggerer (one blocking read
on the queue's events stream, no worker slot) and returns ``{job_id: result}``, which
``total`` sums.  ``delay`` (seconds) holds the jobs back, e.g. to watch the sensor defer.

The queue is the ``queue`` param (default ``chasqui-examples``, or ``$CHASQUI_EXAMPLES_QUEUE``);
run ``chasqui worker --queue chasqui-examples --handlers airflow_provider_chasqui.examples.handlers``.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param, task

from airflow_provider_chasqui.examples.dag_defaults import queue_param
from airflow_provider_chasqui.hooks.chasqui import ChasquiHook
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

with DAG(
    dag_id="chasqui_fan_out_100",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    params={
        "queue": queue_param(),
        "n": Param(100, type="integer", minimum=1),
        "delay": Param(0.0, type="number", minimum=0),
    },
    tags=["chasqui", "example"],
) as dag:

    @task
    def fan_out(params: dict) -> list[str]:
        with ChasquiHook().get_queue(params["queue"]) as queue:
            delay = float(params["delay"]) or None
            jobs = queue.add_bulk([{"name": "square", "data": {"x": i}, "delay": delay} for i in range(params["n"])])
        return [job.id for job in jobs]

    wait_all = ChasquiJobSensor(
        task_id="wait_all",
        job_id=fan_out(),
        queue_name="{{ params.queue }}",
        timeout=timedelta(minutes=10),
        deferrable=True,  # one blocking read in the triggerer, no worker slot
    )

    @task
    def total(results: dict) -> int:
        return sum(r["square"] for r in results.values())

    total(wait_all.output)
