"""Test DAG: every way a deferred ChasquiJobSensor can end, one sensor after the other.

The jobs are delayed so each sensor finds its job unfinished at its first check and defers
(dag.test() runs the trigger inline), except ``wait_bad_soft``, which finds the job already
dead-lettered at that check.  Sensors are chained with ``all_done`` so their order is fixed.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param

from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

QUEUE = "{{ params.queue }}"

with DAG(
    dag_id="chasqui_sensor_cases",
    schedule=None,
    catchup=False,
    default_args={"deferrable": True},
    params={"queue": Param("chasqui-tests", type="string")},
) as dag:
    enqueue_ok = ChasquiEnqueueOperator(
        task_id="enqueue_ok", job_name="square", data={"x": 11}, delay=1.5, queue_name=QUEUE
    )
    enqueue_bad = ChasquiEnqueueOperator(
        task_id="enqueue_bad", job_name="explode", data={"n": 1}, delay=3.0, queue_name=QUEUE
    )
    enqueue_never = ChasquiEnqueueOperator(
        task_id="enqueue_never", job_name="square", data={"x": 0}, delay=timedelta(hours=1), queue_name=QUEUE
    )
    wait_ok = ChasquiJobSensor(task_id="wait_ok", upstream_task_id="enqueue_ok", queue_name=QUEUE, timeout=60)
    wait_bad = ChasquiJobSensor(
        task_id="wait_bad", upstream_task_id="enqueue_bad", queue_name=QUEUE, timeout=60, trigger_rule="all_done"
    )
    wait_bad_soft = ChasquiJobSensor(
        task_id="wait_bad_soft",
        upstream_task_id="enqueue_bad",
        queue_name=QUEUE,
        timeout=60,
        soft_fail=True,
        trigger_rule="all_done",
    )
    wait_timeout = ChasquiJobSensor(
        task_id="wait_timeout", upstream_task_id="enqueue_never", queue_name=QUEUE, timeout=2, trigger_rule="all_done"
    )
    wait_timeout_soft = ChasquiJobSensor(
        task_id="wait_timeout_soft",
        upstream_task_id="enqueue_never",
        queue_name=QUEUE,
        timeout=2,
        soft_fail=True,
        trigger_rule="all_done",
    )
    [enqueue_ok, enqueue_bad, enqueue_never] >> wait_ok >> wait_bad >> wait_bad_soft >> wait_timeout
    wait_timeout >> wait_timeout_soft
