"""Test DAG: a deferrable wait and a deferrable sensor through a connection that carries no
password, to a server that takes only the tokens of ``[chasqui] credential_provider``: the task
(enqueue) and the triggerer (the waits) both authenticate with the configured provider."""

from __future__ import annotations

from airflow.sdk import DAG, Param

from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

QUEUE, CONN = "{{ params.queue }}", "{{ params.conn_id }}"

with DAG(
    dag_id="chasqui_token_auth",
    schedule=None,
    catchup=False,
    params={"queue": Param("chasqui-tests", type="string"), "conn_id": Param("chasqui_tokens", type="string")},
) as dag:
    wait_here = ChasquiEnqueueOperator(
        task_id="wait_here",
        chasqui_conn_id=CONN,
        job_name="square",
        data={"x": 5},
        delay=1.0,
        queue_name=QUEUE,
        wait_for_result=True,
        wait_timeout=120,
        deferrable=True,
    )
    enqueue = ChasquiEnqueueOperator(
        task_id="enqueue", chasqui_conn_id=CONN, job_name="square", data={"x": 6}, delay=1.0, queue_name=QUEUE
    )
    sense = ChasquiJobSensor(
        task_id="sense",
        chasqui_conn_id=CONN,
        upstream_task_id="enqueue",
        queue_name=QUEUE,
        timeout=120,
        deferrable=True,
    )
    wait_here >> enqueue >> sense
