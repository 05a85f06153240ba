"""Event-driven DAGs (Airflow 3.3+): Chasqui queues as asset events, no sensors, no polling DAGs.

* ``chasqui_on_queue_jobs`` -- *queue mode*.  Jobs named ``file_arrived`` enqueued on the queue
  ``chasqui-events`` become asset events; each DAG run reads the jobs that triggered it.  The
  asset watcher is that queue's consumer (ChasquiMQ's ``default`` group), so run no worker on
  it.  A job is acknowledged only after Airflow saved its asset event.  From any producer
  (chasquimq included)::

      SyncQueue("chasqui-events", redis_url=...).add("file_arrived", {"path": "/landing/a.csv"})

Each asset event is one *batch*: the jobs one read found, oldest first, at most ``max_batch``
(100 unless the trigger says otherwise), in ``event.extra["payload"]["jobs"]``.  A burst of jobs
is one event and one run.  A run can still carry several events (a busy scheduler merges them,
in order), so a task iterates every event, then every job::

    for event in triggering_asset_events[incoming_files]:
        for job in event.extra["payload"]["jobs"]:
            ...

One event per batch is what keeps Airflow 3.3 from stranding jobs: it runs a DAG only for the
events saved before the scheduler queued the run, and one event per job left the rest of a
burst waiting for the next job (apache/airflow#56050, fixed in Airflow 3.4).

* ``chasqui_on_square_completed`` -- *completion mode*.  Runs when ``square`` jobs of the queue
  ``chasqui-examples`` complete (the worker of the other example DAGs runs them, with
  ``store_results=True``), reading each job's result.  The watcher keeps its cursor in Redis
  (``{chasqui:chasqui-examples}:cursor:airflow:square``), so a triggerer restart neither
  replays nor skips completions.

Watchers are registered when the dag-processor parses an *unpaused* DAG, and run in the
triggerer.  The queue names can be changed per deployment with the environment variables
``CHASQUI_EVENTS_QUEUE`` and ``CHASQUI_EXAMPLES_QUEUE`` (read when the DAG file is parsed);
the connection is ``chasqui_default``.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, task

from airflow_provider_chasqui.examples.dag_defaults import EVENTS_QUEUE, EXAMPLES_QUEUE
from airflow_provider_chasqui.hooks.chasqui import ChasquiHook
from airflow_provider_chasqui.queues.assets import chasqui_asset

# The queues are fixed when the file is parsed (an asset watcher is not per run), so these DAGs
# have no ``queue`` Param: change them with the environment variables of dag_defaults.

# chasqui_asset: an Asset with its Chasqui watcher, named after the queue that feeds it (Airflow's
# asset page lists watchers by name) and described in extra["chasqui"].
incoming_files = chasqui_asset("chasqui_incoming_files", queue_name=EVENTS_QUEUE, job_names=["file_arrived"])
squares_completed = chasqui_asset(
    "chasqui_squares_completed", queue_name=EXAMPLES_QUEUE, mode="completion", job_names=["square"]
)

with DAG(
    dag_id="chasqui_on_queue_jobs",
    schedule=[incoming_files],
    catchup=False,
    doc_md=__doc__,
    tags=["chasqui", "example", "event-driven"],
):

    @task
    def handle_files(triggering_asset_events: Any = None) -> list[dict[str, Any]]:
        """Every job of every event of this run, oldest first (an event is a batch of jobs)."""
        jobs = [job for event in triggering_asset_events[incoming_files] for job in event.extra["payload"]["jobs"]]
        for job in jobs:
            print(f"job {job['job_id']} ({job['name']}, attempt {job['attempt']}): {job['data']}")
        return [{"job_id": job["job_id"], "path": (job["data"] or {}).get("path")} for job in jobs]

    handle_files()

with DAG(
    dag_id="chasqui_on_square_completed",
    schedule=[squares_completed],
    catchup=False,
    doc_md=__doc__,
    tags=["chasqui", "example", "event-driven"],
):

    @task
    def collect_results(triggering_asset_events: Any = None) -> dict[str, Any]:
        """The completed jobs' results, stored by the worker (``store_results=True``); each event
        is a batch of completions, oldest first."""
        done = [job for event in triggering_asset_events[squares_completed] for job in event.extra["payload"]["jobs"]]
        with ChasquiHook().get_queue(EXAMPLES_QUEUE) as queue:
            results = queue.get_job_result_bulk([job["job_id"] for job in done])
        return {job["job_id"]: result for job, result in zip(done, results)}

    collect_results()
