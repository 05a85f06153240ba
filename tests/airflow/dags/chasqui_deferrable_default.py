"""Test DAG: a Chasqui wait and a sensor that do not pass ``deferrable``, so the deployment's
configuration decides (``[operators] default_deferrable``, ``[chasqui] default_deferrable``).

The job is delayed so neither finds it finished at its first check: deferred, the task log
shows ``[DAG TEST] Trigger completed``; not deferred, the operator blocks and the sensor pokes.
"""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

QUEUE = "{{ params.queue }}"

with DAG(
    dag_id="chasqui_deferrable_default",
    schedule=None,
    catchup=False,
    params={"queue": Param("chasqui-tests", type="string")},
) as dag:
    wait_here = ChasquiEnqueueOperator(
        task_id="wait_here",
        job_name="square",
        data={"x": 3},
        delay=1.0,
        queue_name=QUEUE,
        wait_for_result=True,
        wait_timeout=120,
    )
    enqueue = ChasquiEnqueueOperator(task_id="enqueue", job_name="square", data={"x": 4}, delay=1.0, queue_name=QUEUE)
    sense = ChasquiJobSensor(
        task_id="sense", upstream_task_id="enqueue", queue_name=QUEUE, timeout=120, poke_interval=0.2
    )
    wait_here >> enqueue >> sense
