"""Enqueue Chasqui jobs from Airflow and use their results downstream.

* ``square``: ``ChasquiEnqueueOperator(wait_for_result=True)`` defers until the worker ran
  the job and returns the handler's result.
* ``enqueue_greet`` + ``wait_greet``: enqueue without waiting (the job id goes to XCom),
  then a deferrable ``ChasquiJobSensor`` pulls that id and waits for it.

Run a worker for the queue (the ``queue`` param, by default ``chasqui-examples`` or
``$CHASQUI_EXAMPLES_QUEUE``) with ``store_results=True`` and the handlers of
``airflow_provider_chasqui.examples.handlers``; the connection ``chasqui_default`` points at
its Redis (e.g. ``AIRFLOW_CONN_CHASQUI_DEFAULT='{"conn_type": "chasqui", "host": "localhost"}'``).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param, task

from airflow_provider_chasqui.examples.dag_defaults import queue_param
from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

with DAG(
    dag_id="chasqui_enqueue_and_wait",
    schedule=None,
    catchup=False,
    render_template_as_native_obj=True,
    doc_md=__doc__,
    params={
        "queue": queue_param(),
        "x": Param(7, type="integer"),
        "who": Param("airflow", type="string"),
        "greet_job": Param("greet", type="string", description="job name of the second job"),
    },
    tags=["chasqui", "example"],
) as dag:
    square = ChasquiEnqueueOperator(
        task_id="square",
        job_name="square",
        data={"x": "{{ params.x }}"},
        queue_name="{{ params.queue }}",
        attempts=3,
        backoff={"kind": "exponential", "delay_ms": 200},
        wait_for_result=True,
        wait_timeout=timedelta(minutes=10),
        deferrable=True,  # wait in the triggerer whatever [operators] default_deferrable says
    )
    enqueue_greet = ChasquiEnqueueOperator(
        task_id="enqueue_greet",
        job_name="{{ params.greet_job }}",
        data={"who": "{{ params.who }}"},
        queue_name="{{ params.queue }}",
    )
    wait_greet = ChasquiJobSensor(
        task_id="wait_greet",
        upstream_task_id="enqueue_greet",
        queue_name="{{ params.queue }}",
        timeout=timedelta(minutes=10),
        deferrable=True,
    )

    @task
    def report(square_result: dict, greeting: str) -> str:
        line = f"{greeting}: {square_result['x']}^2 = {square_result['square']}"
        print(line)
        return line

    enqueue_greet >> wait_greet
    report(square.output, wait_greet.output)
