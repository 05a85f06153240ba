"""Dead letters: a job fails for good, the DAG finds it in the DLQ and deals with it.

* ``enqueue_bad``: a job the worker refuses (``explode`` raises ``UnrecoverableError``), so it
  lands in the dead-letter queue at once, with the handler's error in its failure record.
* ``wait_bad``: the deferrable ``ChasquiJobSensor`` fails on a dead-lettered job; with
  ``soft_fail`` the task is skipped instead, and the DAG goes on.
* ``find_in_dlq``: matches the failed task to its DLQ row by job id (``peek_dlq`` shows the job
  id and the handler's error, as ``chasqui dlq peek`` does) and returns them.
* ``settle``: ``remove`` (the default) deletes that one entry; ``replay`` moves it back to the
  queue with its attempts reset (``ChasquiReplayDLQOperator`` replays a whole page).

Run a worker for the queue (the ``queue`` param, by default ``chasqui-examples`` or
``$CHASQUI_EXAMPLES_QUEUE``) with ``--handlers airflow_provider_chasqui.examples.handlers`` (it
stores results and failure records by default); the connection ``chasqui_default`` points at
its Redis.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from airflow.sdk import DAG, Param, task

from airflow_provider_chasqui.examples.dag_defaults import queue_param
from airflow_provider_chasqui.hooks.chasqui import ChasquiHook
from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.sensors.job import ChasquiJobSensor

with DAG(
    dag_id="chasqui_dead_letters",
    schedule=None,
    catchup=False,
    doc_md=__doc__,
    params={
        "queue": queue_param(),
        "action": Param("remove", enum=["remove", "replay"], description="what to do with the dead letter"),
    },
    tags=["chasqui", "example"],
) as dag:
    enqueue_bad = ChasquiEnqueueOperator(
        task_id="enqueue_bad",
        job_name="explode",
        data={"order": 4711},
        queue_name="{{ params.queue }}",
    )
    wait_bad = ChasquiJobSensor(
        task_id="wait_bad",
        upstream_task_id="enqueue_bad",
        queue_name="{{ params.queue }}",
        timeout=timedelta(minutes=5),
        soft_fail=True,  # skipped, not failed: the next tasks handle the dead letter
        deferrable=True,
    )

    @task(trigger_rule="all_done")
    def find_in_dlq(params: dict[str, Any], ti: Any = None) -> dict[str, Any]:
        job_id = ti.xcom_pull(task_ids="enqueue_bad")
        with ChasquiHook().get_queue(params["queue"]) as queue:
            for row in queue.peek_dlq(limit=1000):
                if row["job_id"] == job_id:
                    return {key: row[key] for key in ("dlq_id", "job_id", "name", "reason", "error")}
        raise LookupError(f"job {job_id} is not in the first 1,000 DLQ entries of {params['queue']}")

    @task
    def settle(found: dict[str, Any], params: dict[str, Any]) -> str:
        with ChasquiHook().get_queue(params["queue"]) as queue:
            if params["action"] == "replay":
                moved = queue.replay_dlq_report(limit=1000)  # every decodable entry, ours included
                return f"replayed {moved['replayed']} dead letter(s)"
            removed = queue.remove_dlq([found["dlq_id"]])
            return f"removed {removed} dead letter(s): job {found['job_id']} ({found['error']})"

    found = find_in_dlq()
    enqueue_bad >> wait_bad >> found
    settle(found)
