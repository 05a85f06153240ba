"""Operator extra links from a task in the Airflow UI to its job's or spec's dashboard page.

Airflow 3 computes a link on the worker when the task ends and stores it in XCom; the UI shows
it as a button.  The link opens the dashboard page inside Airflow's own shell (its navigation
and theme around it): ``/plugin/chasqui`` is the plugin's view in the UI, which frames the rest
of the path (``/chasqui/job?...``, the dashboard app on the API server).  Nothing to link (the
task failed before it enqueued) is "".
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from airflow.sdk import BaseOperatorLink

__all__ = ["ChasquiJobLink", "ChasquiScheduleLink", "dashboard_path"]

PREFIX = "/chasqui"  # where the plugin mounts the dashboard app (dashboard/plugin.py URL_PREFIX)
SHELL = "/plugin/chasqui"  # the UI's route of the plugin's view (its external view's url_route)


def dashboard_path(page: str, **params: Any) -> str:
    """The dashboard ``page`` inside Airflow's UI shell."""
    return f"{SHELL}{PREFIX}{page}?" + urlencode({k: v for k, v in params.items() if v})


def _queue(operator: Any) -> str | None:
    if getattr(operator, "queue_name", None):
        name: str = operator.queue_name
        return name
    try:  # the connection's default queue
        from ..hooks.chasqui import ChasquiHook

        return ChasquiHook(operator.chasqui_conn_id).get_settings().default_queue
    except Exception:  # noqa: BLE001 - a link is a convenience: no queue, no link
        return None


def _pull(ti: Any, **kwargs: Any) -> Any:
    pull = getattr(ti, "xcom_pull", None)
    if pull is None:
        return None
    try:
        return pull(**kwargs)
    except Exception:  # noqa: BLE001
        return None


class ChasquiJobLink(BaseOperatorLink):
    """ChasquiEnqueueOperator / ChasquiJobSensor -> the dashboard's page of the job (the first
    one, for a sensor waiting on many)."""

    name = "Chasqui job"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        job_id = getattr(operator, "_job_id", None) or _pull(ti_key, key="job_id")
        if not job_id and getattr(operator, "upstream_task_id", None):
            job_id = _pull(ti_key, task_ids=operator.upstream_task_id, key=operator.xcom_key)
        if not job_id:
            job_id = getattr(operator, "job_id", None)
        if isinstance(job_id, (list, tuple)):
            job_id = job_id[0] if job_id else None
        queue = _queue(operator)
        if not isinstance(job_id, str) or not job_id or not queue:
            return ""
        return dashboard_path("/job", src=operator.chasqui_conn_id, queue=queue, id=job_id)


class ChasquiScheduleLink(BaseOperatorLink):
    """The repeatable operators -> the dashboard's Schedules page searched for the spec's key."""

    name = "Chasqui schedule"

    def get_link(self, operator: Any, *, ti_key: Any) -> str:
        key = getattr(operator, "key", None) or _pull(ti_key, key="return_value")
        queue = _queue(operator)
        if not isinstance(key, str) or not key or not queue:
            return ""
        return dashboard_path("/schedules", src=operator.chasqui_conn_id, queue=queue, prefix=key)
