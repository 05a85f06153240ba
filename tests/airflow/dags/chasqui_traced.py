"""Test DAG for tracing: an add that waits for its result in the triggerer, then a deferred
sensor on a second job.  Run with ``CHASQUI_OTEL=1`` (and an SDK exporting spans), one trace
shows the task -> enqueue -> handler, then the trigger's wait -> the task's resumption."""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

QUEUE = "{{ params.queue }}"

with DAG(
    dag_id="chasqui_traced", schedule=None, catchup=False, params={"queue": Param("chasqui-tests", type="string")}
) as dag:
    square = ChasquiEnqueueOperator(
        task_id="square",
        job_name="square",
        data={"x": 5},
        queue_name=QUEUE,
        wait_for_result=True,
        deferrable=True,
        wait_timeout=120,
    )
    enqueue = ChasquiEnqueueOperator(
        task_id="enqueue", job_name="square", data={"x": 6}, queue_name=QUEUE, delay=1.0
    )  # delayed: the sensor finds it running and defers
    sense = ChasquiJobSensor(
        task_id="sense", upstream_task_id="enqueue", xcom_key="job_id", queue_name=QUEUE, timeout=120, deferrable=True
    )
    square >> enqueue >> sense
