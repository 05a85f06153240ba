"""Helpers shared by the Chasqui operators and sensor: the deferrable default, durations,
turning a ``ChasquiJobTrigger`` event (or a poke's outcomes) into a result or an error, and
the task-log line that says what a wait found.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from ..core.origin import from_context, origin_calls, spec_origin_call
from ..core.outcomes import end_attempts, outcome_line
from ..errors import ChasquiError
from ..hooks.chasqui import ChasquiHook
from ..sync.queue import SyncQueue

log = logging.getLogger(__name__)

__all__ = [
    "default_deferrable",
    "as_seconds",
    "as_datetime",
    "result_from_event",
    "failure_message",
    "waited_seconds",
    "log_outcome",
    "log_resumed",
    "record_origin",
]


def default_deferrable() -> bool:
    """Whether a Chasqui wait defers when its ``deferrable`` argument is not given.

    Airflow's convention, as in the official providers: ``[operators] default_deferrable``
    (False unless configured).  ``[chasqui] default_deferrable``, when set, overrides it for
    this provider's operators and sensor only (``AIRFLOW__CHASQUI__DEFAULT_DEFERRABLE=true``
    defers Chasqui waits while other operators keep blocking).
    """
    if conf.get("chasqui", "default_deferrable", fallback=None) not in (None, ""):
        return conf.getboolean("chasqui", "default_deferrable")
    return conf.getboolean("operators", "default_deferrable", fallback=False)


def as_seconds(value: timedelta | float | None, what: str) -> float | None:
    """A ``timedelta`` or float seconds (the provider's public unit) as float seconds."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise ValueError(f"{what} must be a timedelta or seconds, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:  # NaN passed `< 0` and became a NaN deadline
        raise ValueError(f"{what} must be a finite, non-negative number of seconds, got {value!r}")
    return seconds


def chunk_seconds(value: object, what: str = "wait_chunk_secs") -> float:
    """The longest single blocking wait on Redis: a finite positive number of seconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{what} must be a finite, positive number of seconds, got {value!r}")
    return float(value)


def as_datetime(value: datetime | str | None, what: str) -> datetime | None:
    """A datetime or an ISO 8601 string (what a template renders); naive means UTC."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError as exc:
            raise ValueError(f"{what} is not an ISO 8601 datetime: {value!r}") from exc
    if not isinstance(value, datetime):
        raise ValueError(f"{what} must be a datetime or an ISO 8601 string, got {value!r}")
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def failure_message(event: dict[str, Any]) -> str:
    """The error of a failed job, with the handler's traceback (from the worker) when known."""
    detail, tb = event.get("detail"), event.get("traceback")
    return (
        f"Chasqui job {event.get('job_id')} on queue {event.get('queue')} failed: {event.get('reason')}"
        + (f" ({detail})" if detail else "")
        + (f"\nhandler traceback (from the Chasqui worker):\n{tb.rstrip()}" if tb else "")
    )


def result_from_event(event: dict[str, Any] | None, job_ids: list[str] | None, single: bool) -> Any:
    """The handler result (``single``) or ``{job_id: result}``; raise on error events.

    ``job_ids`` None means "the ids the event carries, in its order".

    ``AirflowFailException`` for a dead-lettered job (retrying the Airflow task would not
    re-run it); a plain ``AirflowException`` for a timeout, so sensors turn it into their
    own timeout handling and operators may retry.
    """
    status = (event or {}).get("status")
    if status == "success":
        results = event["results"]  # type: ignore[index]
        ids = list(results) if job_ids is None else job_ids
        return results[ids[0]] if single else {j: results[j] for j in ids}
    if status == "error":
        raise AirflowFailException(failure_message(event))  # type: ignore[arg-type]
    if status == "timeout":
        pending = event["pending"]  # type: ignore[index]
        raise AirflowException(f"Chasqui job(s) still running at the deadline: {pending}")
    raise AirflowException(f"unexpected ChasquiJobTrigger event: {event!r}")


def waited_seconds(context: Any, started: float | None = None) -> float | None:
    """How long the task waited: since ``started`` (``time.monotonic()`` in this process), or,
    resumed after a deferral, since the task instance started (kept across the deferral)."""
    if started is not None:
        return time.monotonic() - started
    ti = context.get("ti") if isinstance(context, Mapping) else None
    start = getattr(ti, "start_date", None)
    if isinstance(start, datetime):
        start = start if start.tzinfo else start.replace(tzinfo=UTC)
        return max(0.0, (datetime.now(UTC) - start).total_seconds())
    return None


def log_outcome(
    log: Any,
    queue: SyncQueue | None,
    event: dict[str, Any] | None,
    job_ids: list[str] | None,
    waited: float | None,
    queue_name: str | None = None,
) -> None:
    """Log what a wait found: the jobs, their queue, the state, the attempts they ended on, the
    result (cut to a size) or the failure reason, and how long the task waited.

    The attempts are a best-effort read of the newest events through ``queue``: without one, or
    on a Redis error, they show as "unknown" rather than failing a task whose outcome is known.
    """
    event = event or {}
    status = event.get("status")
    name = event.get("queue") or (queue.name if queue is not None else queue_name) or "(connection default)"
    if status == "success":
        results = event.get("results") or {}
        ids = list(results) if job_ids is None else job_ids
        log.info(
            "%s", outcome_line(name, ids, "completed", attempts=_attempts(queue, ids), waited=waited, results=results)
        )
    elif status == "error":
        ids = [str(event.get("job_id"))]
        detail = event.get("detail")
        reason = f"{event.get('reason')}" + (f" ({detail})" if detail else "")
        log.warning(
            "%s", outcome_line(name, ids, "failed", attempts=_attempts(queue, ids), waited=waited, reason=reason)
        )
    elif status == "timeout":
        log.warning(
            "%s", outcome_line(name, list(event.get("pending") or []), "still running at the deadline", waited=waited)
        )


def log_resumed(
    log: Any,
    conn_id: str,
    queue_name: str | None,
    event: dict[str, Any] | None,
    job_ids: list[str] | None,
    context: Any,
) -> None:
    """:func:`log_outcome` after a deferral, with a queue opened for the attempts when it can be."""
    name = (event or {}).get("queue") or queue_name
    try:
        queue: SyncQueue | None = ChasquiHook(conn_id).get_queue(name)
    except (ChasquiError, AirflowException):  # no connection (any more): log without the attempts
        queue = None
    try:
        log_outcome(log, queue, event, job_ids, waited_seconds(context), name)
    finally:
        if queue is not None:
            queue.close()


def _attempts(queue: SyncQueue | None, ids: list[str]) -> dict[str, int]:
    if queue is None:
        return {}
    try:
        return queue.driver.run(end_attempts(queue.keys, ids))
    except ChasquiError:
        return {}


def record_origin(queue: SyncQueue, context: Any, *, job_ids: Sequence[str] = (), spec_key: str | None = None) -> None:
    """Note which DAG run and task enqueued these jobs or upserted this spec, for the dashboard's
    link back (``core/origin.py``).  A failure costs the link only: logged, never raised."""
    origin = from_context(context)
    if origin is None:
        return
    calls = origin_calls(queue.keys, list(job_ids), origin)
    if spec_key is not None:
        calls.append(spec_origin_call(queue.keys, spec_key, origin))
    try:
        queue.driver.pipeline(calls)
    except ChasquiError as exc:
        log.warning("queue %s: could not record the task that made %s: %s", queue.name, job_ids or spec_key, exc)
