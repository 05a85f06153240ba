"""An asset fed by a Chasqui queue, saying so where Airflow shows it (issue 28).

``chasqui_asset("incoming_files", queue_name="files", job_names=["file_arrived"])`` is an
``Asset`` with one ``AssetWatcher`` (common-messaging's ``MessageQueueTrigger``, scheme
``chasqui``, see ``queues/chasqui.py``).  Airflow's asset page lists watchers by name, so the
watcher's name is the feed: ``chasqui queue files on chasqui_default (file_arrived)``; the
asset's ``extra["chasqui"]`` holds the same facts for code, with the dashboard's page of the
queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from ..core.keys import validate_queue_name
from ..errors import ConfigError

__all__ = ["chasqui_asset", "feed_name"]

MODES = ("queue", "completion")


def feed_name(queue_name: str, mode: str, conn_id: str, job_names: Sequence[str] | None) -> str:
    """What the watcher is called: the queue, what of it becomes events, and the connection."""
    jobs = f" ({', '.join(job_names)})" if job_names else ""
    what = "queue" if mode == "queue" else "completions of"
    return f"chasqui {what} {queue_name} on {conn_id}{jobs}"


def chasqui_asset(
    name: str,
    *,
    queue_name: str,
    mode: str = "queue",
    job_names: Sequence[str] | None = None,
    chasqui_conn_id: str = "chasqui_default",
    extra: Mapping[str, Any] | None = None,
    **trigger_kwargs: Any,
) -> Any:
    """An asset whose events are the jobs (``mode="queue"``) or completions (``"completion"``) of
    ``queue_name``; ``trigger_kwargs`` go to the trigger (``max_batch``, ``linger_ms``,
    ``cursor``...).  Bad arguments raise ``ConfigError`` when the DAG file is parsed."""
    from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
    from airflow.sdk import Asset, AssetWatcher

    validate_queue_name(queue_name)
    if mode not in MODES:
        raise ConfigError(f"chasqui_asset mode must be 'queue' or 'completion', got {mode!r}")
    if not isinstance(chasqui_conn_id, str) or not chasqui_conn_id:
        raise ConfigError("chasqui_asset chasqui_conn_id must be a non-empty str")
    names = list(job_names) if job_names is not None else None
    if names is not None and not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f"chasqui_asset job_names must be non-empty strs, got {job_names!r}")
    kwargs: dict[str, Any] = {"queue_name": queue_name, "mode": mode, "chasqui_conn_id": chasqui_conn_id}
    if names:
        kwargs["job_names"] = names
    trigger = MessageQueueTrigger(scheme="chasqui", **kwargs, **trigger_kwargs)
    feed: dict[str, Any] = {
        "queue": queue_name,
        "mode": mode,
        "connection": chasqui_conn_id,
        "job_names": names or [],
        "dashboard": "/plugin/chasqui/chasqui/queue?" + urlencode({"src": chasqui_conn_id, "queue": queue_name}),
    }
    return Asset(
        name,
        watchers=[AssetWatcher(name=feed_name(queue_name, mode, chasqui_conn_id, names), trigger=trigger)],
        extra={**(extra or {}), "chasqui": feed},
    )
