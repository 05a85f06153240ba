"""``ChasquiJobTrigger``: waits in the triggerer until Chasqui jobs end.

It blocks on Redis through the asyncio engine (``Queue.wait_for_results``), never in a
sleep-and-poll loop: every trigger of the triggerer waiting on one queue shares that queue's
event hub (``engine/event_hub.py``: one XREAD BLOCK reader per queue, stored outcomes read
first), so a thousand deferred tasks cost one connection and one decode per event.  The
wait runs in bounded chunks so cancellation, the optional deadline and Redis outages are
handled between chunks.  Events are JSON-safe dicts:

* ``{"status": "success", "results": {job_id: handler result}}``
* ``{"status": "error", "job_id": ..., "reason": ..., "detail": ..., "traceback": ...}`` (a job in
  the DLQ, with the handler's traceback when the worker recorded one; or a result Airflow
  cannot carry, without ``traceback``)
* ``{"status": "timeout", "pending": [job_id, ...]}`` (the deadline passed)

Outcomes are read from the result/failure records, so the worker must run with
``store_results=True``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Mapping
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from .. import tracing
from ..core.event_hub import Failed, JobOutcome
from ..core.job_details import JobDetails
from ..core.keys import validate_queue_name
from ..core.outcomes import outcome_line
from ..core.running import check_job_ids
from ..engine.queue import Queue
from ..errors import ChasquiConnectionError, ChasquiError
from ..hooks.chasqui import ChasquiHook, check_conn_id
from ..operators._common import chunk_seconds

__all__ = ["ChasquiJobTrigger", "first_error", "json_safe_problem"]

_MAX_BACKOFF_SECS = 10.0
_JSON_SCALARS = (str, int, float, bool, type(None))


def json_safe_problem(value: Any, path: str = "result") -> str | None:
    """Where ``value`` holds something Airflow cannot carry as JSON: bytes, msgpack ext, a key
    that is not a str, or a NaN or infinite float (JSON has none: Airflow's REST API shows it
    as null, and a strict JSON column such as PostgreSQL's refuses it)."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{path} is a non-finite float ({value!r}): JSON has no such number"
    if isinstance(value, _JSON_SCALARS):
        return None
    if isinstance(value, list):
        for i, item in enumerate(value):
            problem = json_safe_problem(item, f"{path}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has a non-string key {key!r}"
            problem = json_safe_problem(item, f"{path}[{key!r}]")
            if problem:
                return problem
        return None
    return f"{path} is a {type(value).__name__}"


def first_error(job_ids: list[str], outcomes: Mapping[str, JobOutcome], queue: str) -> dict[str, Any] | None:
    """The error event for the first job (in ``job_ids`` order) that was dead-lettered or
    returned something Airflow cannot carry; None when every finished job is fine."""
    for jid in job_ids:
        outcome = outcomes.get(jid)
        if outcome is None:
            continue
        if isinstance(outcome, Failed):
            return {
                "status": "error",
                "job_id": jid,
                "reason": outcome.value,
                "detail": outcome.detail,
                "traceback": outcome.traceback,
                "queue": queue,
            }
        problem = json_safe_problem(outcome.value)
        if problem:
            return {
                "status": "error",
                "job_id": jid,
                "reason": "result_not_json_safe",
                "detail": f"{problem}; handlers awaited by Airflow must return JSON-compatible values "
                "(str, numbers, bools, None, lists, dicts with str keys)",
                "queue": queue,
            }
    return None


STATE_LOG_SECS = 120.0  # how often a wait logs where its jobs are
STATE_LOG_JOBS = 5  # ... for at most this many of them
NO_WORKER_CHECK_SECS = 30.0  # many triggers of one queue deferring together: one check, one warning
_LAST_NO_WORKER_CHECK: dict[tuple[str, str], float] = {}


def state_text(d: JobDetails) -> str:
    """Where a job is, in words: ``active on worker c-host-pid-..., attempt 2, progress 40``."""
    if d.state == "active":
        text = f"active on worker {d.consumer or '?'}, attempt {d.attempt or 1}"
    elif d.state == "delayed" and d.run_at_ms is not None:
        text = f"delayed until {datetime.fromtimestamp(d.run_at_ms / 1000, UTC).isoformat(timespec='seconds')}"
    elif d.state == "waiting":
        text = "waiting in the stream for a worker"
    else:
        text = d.state
    return text + (f", progress {d.progress}" if d.progress is not None else "")


class ChasquiJobTrigger(BaseTrigger):
    """Fires once every job in ``job_ids`` completed, or when one was dead-lettered.

    A dead letter ends the wait as soon as the hub sees its event (``stop_on_failure``).

    Runs in the triggerer's event loop and waits through the loop's shared event hub of its
    queue (opened by the first waiting trigger, closed after the last); its own ``Queue``
    opens no connection for the wait and is closed on every exit.  Free of side effects unless
    ``cancel_on_kill`` (a user kill then cancels the jobs: ``Queue.cancel``), so running it
    twice (triggerer HA) is harmless.

    :param job_ids: the jobs to wait for.
    :param queue_name: their queue.
    :param chasqui_conn_id: the ``chasqui`` connection.
    :param deadline: Unix time (seconds) after which a ``timeout`` event fires; None = never.
    :param wait_chunk_secs: longest single blocking wait on Redis.
    :param cancel_on_kill: on a user kill, cancel the jobs (waiting, delayed or running).
    :param traceparent: the deferring task's W3C trace context (OpenTelemetry on): the wait is a
        span of that trace and the event carries the wait's context to the resumed task.
    :param state_log_secs: while waiting, log where the jobs are this often (at most
        ``STATE_LOG_JOBS`` of them: waiting, active on which worker with its attempt and
        progress, delayed until when); 0 = never.  At the start, a warning when the queue has
        no live worker (none beats and no consumer is alive: a wrong queue name, no worker
        started), whatever this says.
    """

    def __init__(
        self,
        *,
        job_ids: list[str],
        queue_name: str,
        chasqui_conn_id: str = ChasquiHook.default_conn_name,
        deadline: float | None = None,
        wait_chunk_secs: float = 10.0,
        cancel_on_kill: bool = False,
        traceparent: str | None = None,
        state_log_secs: float = STATE_LOG_SECS,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is unannotated
        if isinstance(job_ids, str) or not job_ids or not all(isinstance(j, str) and j for j in job_ids):
            raise ValueError(f"job_ids must be a non-empty list of job id strings, got {job_ids!r}")
        check_job_ids(job_ids)
        validate_queue_name(queue_name)
        check_conn_id(chasqui_conn_id)
        if deadline is not None and (
            isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline)
        ):  # NaN compared false with every clock reading: the wait never timed out
            raise ValueError(f"deadline must be None or a finite Unix time in seconds, got {deadline!r}")
        if not isinstance(cancel_on_kill, bool):
            raise ValueError(f"cancel_on_kill must be True or False, got {cancel_on_kill!r}")
        if traceparent is not None and not isinstance(traceparent, str):
            raise ValueError(f"traceparent must be None or a W3C traceparent str, got {traceparent!r}")
        chunk_seconds(wait_chunk_secs)
        if (
            isinstance(state_log_secs, bool)
            or not isinstance(state_log_secs, (int, float))
            or not (0 <= state_log_secs < float("inf"))
        ):
            raise ValueError(
                f"state_log_secs must be 0 (never) or a positive number of seconds, got {state_log_secs!r}"
            )
        self.job_ids = list(dict.fromkeys(job_ids))
        self.queue_name = queue_name
        self.chasqui_conn_id = chasqui_conn_id
        self.deadline = deadline
        self.wait_chunk_secs = wait_chunk_secs
        self.cancel_on_kill = cancel_on_kill
        self.traceparent = traceparent
        self.state_log_secs = float(state_log_secs)
        self._queue: Queue | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_ids": list(self.job_ids),
                "queue_name": self.queue_name,
                "chasqui_conn_id": self.chasqui_conn_id,
                "deadline": self.deadline,
                "wait_chunk_secs": self.wait_chunk_secs,
                "cancel_on_kill": self.cancel_on_kill,
                "traceparent": self.traceparent,
                "state_log_secs": self.state_log_secs,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self._queue = queue = await ChasquiHook(self.chasqui_conn_id).aget_queue(self.queue_name)
        started = time.monotonic()
        try:
            with tracing.trigger_span(self.traceparent, self.queue_name, self.job_ids) as wait_tp:
                payload = await self._wait(queue)
            if wait_tp:
                payload["traceparent"] = wait_tp
        finally:
            await self.cleanup()
        self._log_outcome(payload, time.monotonic() - started)
        yield TriggerEvent(payload)

    def _log_outcome(self, payload: dict[str, Any], waited: float) -> None:
        """The triggerer's log line for what the wait found (the resumed task logs the attempts)."""
        status = payload.get("status")
        if status == "success":
            self.log.info(
                "%s",
                outcome_line(self.queue_name, self.job_ids, "completed", waited=waited, results=payload["results"]),
            )
        elif status == "error":
            detail = payload.get("detail")
            self.log.warning(
                "%s",
                outcome_line(
                    self.queue_name,
                    [payload["job_id"]],
                    "failed",
                    waited=waited,
                    reason=f"{payload['reason']}" + (f" ({detail})" if detail else ""),
                ),
            )
        elif status == "timeout":
            self.log.warning(
                "%s", outcome_line(self.queue_name, payload["pending"], "still running at the deadline", waited=waited)
            )

    async def cleanup(self) -> None:
        """Close the queue's pool; ``run()`` calls it in ``finally``, the triggerer again (a no-op)."""
        queue, self._queue = self._queue, None
        if queue is not None:
            await queue.close()

    async def _wait(self, queue: Queue) -> dict[str, Any]:
        pending, results = list(self.job_ids), {}
        failures = 0
        self.log.info("waiting for %d job(s) on queue %s", len(pending), self.queue_name)
        await self._look(self._warn_if_nobody_consumes)
        next_state = time.monotonic() + self.state_log_secs
        while pending:
            if self.state_log_secs and time.monotonic() >= next_state:
                next_state = time.monotonic() + self.state_log_secs
                await self._look(self._log_states, pending)
            chunk = self.wait_chunk_secs
            if self.deadline is not None:
                remaining = self.deadline - time.time()
                if remaining <= 0:
                    return {"status": "timeout", "pending": pending, "queue": self.queue_name}
                chunk = min(chunk, remaining)
            try:
                outcomes = await queue.wait_for_results(pending, timeout=chunk, stop_on_failure=True)
                failures = 0
            except ChasquiConnectionError as exc:
                failures += 1
                delay = min(0.5 * 2 ** min(failures, 5), _MAX_BACKOFF_SECS, chunk)
                self.log.warning("queue %s: Redis unavailable (%s); retrying in %.1f s", self.queue_name, exc, delay)
                await asyncio.sleep(delay)
                continue
            error = first_error(pending, outcomes, self.queue_name)
            if error is not None:
                return error
            for jid in pending:
                if jid in outcomes:
                    results[jid] = outcomes[jid].value
            pending = [j for j in pending if j not in results]
        return {"status": "success", "results": {j: results[j] for j in self.job_ids}, "queue": self.queue_name}

    async def _look(self, what: Any, *args: Any) -> None:
        """Run a look at the queue on a connection of its own, closed right after: the wait
        itself holds none (the loop's shared event hub reads for every trigger), and a thousand
        waiting triggers must not each keep one for a look every few minutes."""
        try:
            queue = await ChasquiHook(self.chasqui_conn_id).aget_queue(self.queue_name)
        except ChasquiError as exc:
            self.log.info("queue %s: could not look at the queue (%s)", self.queue_name, exc)
            return
        try:
            await what(queue, *args)
        finally:
            await queue.close()

    async def _warn_if_nobody_consumes(self, queue: Queue) -> None:
        """A wait on a queue no worker consumes would be silent until its timeout: say so now
        (once per queue and connection every ``NO_WORKER_CHECK_SECS`` in one triggerer)."""
        key = (self.chasqui_conn_id, self.queue_name)
        now = time.monotonic()
        if now - _LAST_NO_WORKER_CHECK.get(key, float("-inf")) < NO_WORKER_CHECK_SECS:
            return
        _LAST_NO_WORKER_CHECK[key] = now
        try:
            s = await queue.inspect()
        except ChasquiError as exc:  # the wait itself retries outages; this is only a hint
            self.log.info("queue %s: could not check for live workers (%s)", self.queue_name, exc)
            return
        if s.live_consumers:
            return
        why = "no worker has read it yet (no consumer group)" if not s.group_exists else "no consumer is alive"
        self.log.warning(
            "queue %s has no live worker: %s; the job(s) wait until one starts. Is the queue name right, "
            "and is `chasqui worker --queue %s` running?",
            self.queue_name,
            why,
            self.queue_name,
        )

    async def _log_states(self, queue: Queue, pending: list[str]) -> None:
        """One line per job still waited for (at most ``STATE_LOG_JOBS``): where it is now."""
        for jid in pending[:STATE_LOG_JOBS]:
            try:
                d = await queue.get_job_details(jid, events_window=200)
            except ChasquiError as exc:
                self.log.info("still waiting for job %s on queue %s (state unknown: %s)", jid, self.queue_name, exc)
                continue
            self.log.info("still waiting for job %s on queue %s: %s", jid, self.queue_name, state_text(d))
        if len(pending) > STATE_LOG_JOBS:
            self.log.info("... and %d more job(s) of queue %s", len(pending) - STATE_LOG_JOBS, self.queue_name)

    async def on_kill(self) -> None:
        """A user killed the task: cancel its jobs when ``cancel_on_kill`` (``Queue.cancel``)."""
        if not self.cancel_on_kill:
            return
        queue = await ChasquiHook(self.chasqui_conn_id).aget_queue(self.queue_name)
        try:
            for jid in self.job_ids:
                state = await queue.cancel(jid)
                self.log.info("queue %s: cancel of job %s: %s", self.queue_name, jid, state)
        finally:
            await queue.close()
