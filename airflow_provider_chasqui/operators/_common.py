"""Helpers shared by the Chasqui operators and sensor: the deferrable default, durations,
and turning a ``ChasquiJobTrigger`` event (or a poke's outcomes) into a result or an error.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from airflow.sdk import conf
from airflow.sdk.exceptions import AirflowException, AirflowFailException

__all__ = ["default_deferrable", "as_seconds", "as_datetime", "result_from_event", "failure_message"]

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
    if seconds < 0:
        raise ValueError(f"{what} must not be negative, got {value!r}")
    return seconds


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
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def failure_message(event: dict[str, Any]) -> str:
    detail = event.get("detail")
    return (f"Chasqui job {event.get('job_id')} on queue {event.get('queue')} failed: {event.get('reason')}"
            + (f" ({detail})" if detail else ""))


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
