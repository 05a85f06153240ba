"""Operators that manage repeatable (cron / every) job specs through ``SyncQueue``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from ..core.dedup import check_dedup
from ..core.priorities import check_priority
from ..core.repeat import MissedFiresPolicy, RepeatPattern
from ..core.running import check_timeout_ms
from ..hooks.chasqui import ChasquiHook
from ..sync.queue import SyncQueue
from ..types import BackoffSpec, build_retry_override
from ._common import as_datetime, as_seconds, record_origin
from .links import ChasquiScheduleLink

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = [
    "ChasquiUpsertRepeatableOperator",
    "ChasquiRemoveRepeatableOperator",
    "ChasquiPauseRepeatableOperator",
    "ChasquiResumeRepeatableOperator",
]

_MISSED = {"skip": MissedFiresPolicy.skip, "fire-once": MissedFiresPolicy.fire_once}


def _policy(missed_fires: str | None, max_catchup: int | None) -> MissedFiresPolicy | None:
    if missed_fires is None:
        if max_catchup is not None:
            raise ValueError("max_catchup needs missed_fires='fire-all'")
        return None
    if missed_fires == "fire-all":
        if max_catchup is None:
            raise ValueError("missed_fires='fire-all' needs max_catchup")
        return MissedFiresPolicy.fire_all(max_catchup)
    if missed_fires not in _MISSED:
        raise ValueError(f"missed_fires must be 'skip', 'fire-once' or 'fire-all', got {missed_fires!r}")
    if max_catchup is not None:
        raise ValueError("max_catchup only applies to missed_fires='fire-all'")
    return _MISSED[missed_fires]()


class ChasquiUpsertRepeatableOperator(BaseOperator):
    """Creates or replaces a repeatable spec: Chasqui's scheduler then enqueues ``job_name`` on
    every ``cron`` fire (or every ``every`` seconds).  Idempotent: running it again with the
    same key updates the spec in place, so a daily DAG can keep it declared.  Returns the spec key.

    :param job_name: the job name each fire enqueues. (templated)
    :param data: each fire's payload. (templated)
    :param cron: a 5- or 6-field cron expression; excludes ``every``. (templated)
    :param tz: the cron's time zone (IANA name, ``UTC`` or ``±HH:MM``). (templated)
    :param every: a fixed interval (``timedelta`` or float seconds, millisecond precision).
    :param key: the spec key; default: derived from the job name and pattern. (templated)
    :param limit: stop after this many fires.
    :param start_after: no fire before this time (datetime or ISO 8601). (templated)
    :param end_before: no fire from this time on (datetime or ISO 8601). (templated)
    :param missed_fires: what a late scheduler does: ``skip`` (default), ``fire-once`` or ``fire-all``.
    :param max_catchup: fires replayed per tick with ``fire-all``.
    :param deadline: skip (and count) a fire that would start later than this after its
        scheduled time (``timedelta`` or float seconds).
    :param while_paused: what a fire due while the queue is paused does: ``queue`` (default:
        it runs after the resume) or ``skip`` (it is skipped and counted).
    :param attempts: attempts of each fired job.
    :param backoff: retry backoff of each fired job: int ms, a ``BackoffSpec`` or its dict form.
    :param timeout_ms: stop each attempt of each fired job after this many milliseconds (reason
        ``timeout``, then the retry policy; docs/running-jobs.md).
    :param priority: every fired job's priority (an int, 1 the most urgent; docs/flow-control.md).
    :param group: every fired job's group (a tenant); not with ``priority``. (templated)
    :param dedup_id: every fire is added as ``add(dedup_id=...)`` adds a job: ``dedup_mode``
        ``throttle`` (a fire while the id's marker lives adds nothing) or ``debounce`` (the fire
        waits ``dedup_ttl_ms`` and replaces the one still waiting); the marker is shared with
        every other producer of the id. Not with ``priority`` or ``group``. (templated)
    :param queue_name: the queue; default: the connection's ``default_queue``. (templated)
    :param chasqui_conn_id: the ``chasqui`` connection. (templated)
    """

    template_fields: Sequence[str] = (
        "job_name",
        "data",
        "cron",
        "tz",
        "key",
        "start_after",
        "end_before",
        "group",
        "dedup_id",
        "queue_name",
        "chasqui_conn_id",
    )
    template_fields_renderers = {"data": "json"}
    operator_extra_links = (ChasquiScheduleLink(),)
    ui_color = "#f4d35e"

    def __init__(
        self,
        *,
        job_name: str,
        data: Any = None,
        cron: str | None = None,
        tz: str | None = None,
        every: timedelta | float | None = None,
        key: str | None = None,
        limit: int | None = None,
        start_after: datetime | str | None = None,
        end_before: datetime | str | None = None,
        missed_fires: str | None = None,
        max_catchup: int | None = None,
        deadline: timedelta | float | None = None,
        while_paused: str | None = None,
        attempts: int | None = None,
        backoff: int | BackoffSpec | Mapping[str, Any] | None = None,
        timeout_ms: int | float | None = None,
        priority: int | None = None,
        group: str | None = None,
        dedup_id: str | None = None,
        dedup_mode: str = "throttle",
        dedup_ttl_ms: int | float | None = None,
        queue_name: str | None = None,
        chasqui_conn_id: str = ChasquiHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (cron is None) == (every is None):
            raise ValueError("give exactly one of cron and every")
        if tz is not None and cron is None:
            raise ValueError("tz only applies to cron")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        _policy(missed_fires, max_catchup)
        build_retry_override(attempts, backoff)
        self.job_name = job_name
        self.data = data
        self.cron = cron
        self.tz = tz
        self.every = as_seconds(every, "every")
        if self.every is not None and self.every < 0.001:
            raise ValueError("every must be at least one millisecond")
        self.key = key
        self.limit = limit
        self.start_after = start_after
        self.end_before = end_before
        self.missed_fires = missed_fires
        self.max_catchup = max_catchup
        self.deadline = as_seconds(deadline, "deadline")
        if while_paused not in (None, "queue", "skip"):
            raise ValueError(f"while_paused must be 'queue' or 'skip', got {while_paused!r}")
        self.while_paused = while_paused
        self.attempts = attempts
        self.backoff = backoff.to_dict() if isinstance(backoff, BackoffSpec) else backoff
        self.timeout_ms = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        if priority is not None and group is not None:
            raise ValueError("priority cannot be combined with group")
        self.priority = None if priority is None else check_priority(priority)
        self.group = group  # checked when it is rendered (a template)
        if dedup_id is not None:
            if priority is not None or group is not None:
                raise ValueError("dedup_id cannot be combined with priority or group")
            check_dedup("checked-at-run-time", dedup_mode, dedup_ttl_ms)  # the id may be a template
        elif dedup_ttl_ms is not None or dedup_mode != "throttle":
            raise ValueError("dedup_mode and dedup_ttl_ms need dedup_id")
        self.dedup_id, self.dedup_mode, self.dedup_ttl_ms = dedup_id, dedup_mode, dedup_ttl_ms
        self.queue_name = queue_name
        self.chasqui_conn_id = chasqui_conn_id

    def _pattern(self) -> RepeatPattern:
        if self.cron is not None:
            return RepeatPattern.cron(self.cron, tz=self.tz or None)
        return RepeatPattern.every(round(self.every * 1000))  # type: ignore[operator]

    def execute(self, context: Context) -> str:
        with ChasquiHook(self.chasqui_conn_id).get_queue(self.queue_name) as queue:
            spec_key = queue.upsert_repeatable_job(
                self.job_name,
                self.data,
                repeat=self._pattern(),
                key=self.key or None,
                limit=self.limit,
                start_after=as_datetime(self.start_after, "start_after"),
                end_before=as_datetime(self.end_before, "end_before"),
                missed_fires=_policy(self.missed_fires, self.max_catchup),
                deadline=None if self.deadline is None else timedelta(seconds=self.deadline),
                while_paused=self.while_paused,
                attempts=self.attempts,
                backoff=self.backoff,
                timeout_ms=self.timeout_ms,
                priority=self.priority,
                group=self.group or None,
                **self._dedup(),
            ).id  # the Job's id is the spec key
            record_origin(queue, context, spec_key=spec_key)
            info = queue.get_repeatable_job(spec_key)
            self.log.info(
                "queue %s: repeatable spec %s upserted: %s; next fire %s",
                queue.name,
                spec_key,
                self._describe(),
                "unknown" if info is None else _utc(info.next_fire_ms),
            )
        return spec_key

    def _dedup(self) -> dict[str, Any]:
        if not self.dedup_id:
            return {}
        return {"dedup_id": self.dedup_id, "dedup_mode": self.dedup_mode, "dedup_ttl_ms": self.dedup_ttl_ms}

    def _describe(self) -> str:
        """The schedule in words: ``cron "0 3 * * *" in Europe/Lima`` or ``every 90 s``."""
        if self.cron is not None:
            return f'cron "{self.cron}" in {self.tz or "UTC"}'
        return f"every {self.every:g} s"


def _utc(ms: int) -> str:
    """An epoch-ms fire time as ISO 8601 UTC (a far-future sentinel as it is)."""
    try:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return str(ms)


class _ChasquiSpecKeyOperator(BaseOperator):
    """Shared shape of the operators that act on one spec by key; returns whether it existed."""

    template_fields: Sequence[str] = ("key", "queue_name", "chasqui_conn_id")
    operator_extra_links = (ChasquiScheduleLink(),)
    ui_color = "#f4d35e"
    _done = ""

    def __init__(
        self,
        *,
        key: str,
        missing_ok: bool = True,
        queue_name: str | None = None,
        chasqui_conn_id: str = ChasquiHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.key = key
        self.missing_ok = missing_ok
        self.queue_name = queue_name
        self.chasqui_conn_id = chasqui_conn_id

    def _apply(self, queue: SyncQueue) -> bool:
        raise NotImplementedError

    def execute(self, context: Context) -> bool:
        with ChasquiHook(self.chasqui_conn_id).get_queue(self.queue_name) as queue:
            found = bool(self._apply(queue))
            name = queue.name
        if not found and not self.missing_ok:
            raise AirflowFailException(f"queue {name}: no repeatable spec with key {self.key!r}")
        self.log.info("queue %s: repeatable spec %s %s", name, self.key, self._done if found else "does not exist")
        return found


class ChasquiRemoveRepeatableOperator(_ChasquiSpecKeyOperator):
    """Removes a repeatable spec (active or paused); returns whether one was removed.

    :param key: the spec key (what the upsert returned). (templated)
    :param missing_ok: succeed when no such spec exists (default), else fail.
    :param queue_name: the queue; default: the connection's ``default_queue``. (templated)
    :param chasqui_conn_id: the ``chasqui`` connection. (templated)
    """

    _done = "removed"

    def _apply(self, queue: SyncQueue) -> bool:
        return queue.remove_repeatable_by_key(self.key)


class ChasquiPauseRepeatableOperator(_ChasquiSpecKeyOperator):
    """Pauses a repeatable spec (no scheduler fires it until resumed); idempotent.

    Returns whether the spec exists.  Parameters as :class:`ChasquiRemoveRepeatableOperator`.
    """

    _done = "paused"

    def _apply(self, queue: SyncQueue) -> bool:
        return queue.pause_repeatable(self.key)


class ChasquiResumeRepeatableOperator(_ChasquiSpecKeyOperator):
    """Resumes a paused spec at its next future fire (windows missed while paused are not
    fired); idempotent.  Returns whether the spec exists.  Parameters as
    :class:`ChasquiRemoveRepeatableOperator`.
    """

    _done = "resumed"

    def _apply(self, queue: SyncQueue) -> bool:
        return queue.resume_repeatable(self.key)
