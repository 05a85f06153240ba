"""``ChasquiJobSensor``: wait for one or many Chasqui jobs to finish and return their results."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, AirflowSkipException

from .. import tracing
from ..core.outcomes import ids_text
from ..hooks.chasqui import ChasquiHook
from ..operators._common import (
    chunk_seconds,
    default_deferrable,
    failure_message,
    log_outcome,
    log_resumed,
    result_from_event,
    waited_seconds,
)
from ..operators.links import ChasquiJobLink
from ..sync.queue import SyncQueue
from ..triggers.job import ChasquiJobTrigger, first_error

if TYPE_CHECKING:
    from airflow.sdk import Context

__all__ = ["ChasquiJobSensor"]


class ChasquiJobSensor(BaseSensorOperator):
    """Waits until Chasqui jobs completed; fails with the reason when one is dead-lettered.

    Give the ids directly (``job_id``: one id, a list, or an upstream ``.output``) or name the
    upstream task whose XCom holds them (``upstream_task_id`` + ``xcom_key``).  Deferrable (the
    default follows ``[operators] default_deferrable``), the sensor checks once; if the jobs are
    not done it defers to :class:`ChasquiJobTrigger`, which blocks on Redis in the triggerer, so
    one sensor can wait for thousands of jobs without a worker slot.  Otherwise it pokes
    (``poke``/``reschedule`` modes).
    ``timeout``, ``soft_fail`` and ``never_fail`` behave as in Airflow's own sensors; a
    dead-lettered job counts as a failure (so ``soft_fail`` skips).

    Returns the handler's result for a single id, or ``{job_id: result}`` for a list.  The
    worker must run with ``store_results=True``.  One instance per task; not thread-safe.

    :param job_id: a job id or a list of ids. (templated)
    :param upstream_task_id: instead of ``job_id``: the task whose XCom holds the id(s). (templated)
    :param xcom_key: the XCom key to pull from ``upstream_task_id``. (templated)
    :param queue_name: the jobs' queue; default: the connection's ``default_queue``. (templated)
    :param chasqui_conn_id: the ``chasqui`` connection. (templated)
    :param deferrable: defer to the triggerer (default: ``[operators] default_deferrable``, False
        unless configured, or ``[chasqui] default_deferrable`` when set; see
        :func:`~airflow_provider_chasqui.operators._common.default_deferrable`).
    :param wait_chunk_secs: longest single blocking wait of the trigger on Redis.

    .. seealso:: :class:`~airflow_provider_chasqui.triggers.job.ChasquiJobTrigger`
    """

    template_fields: Sequence[str] = ("job_id", "upstream_task_id", "xcom_key", "queue_name", "chasqui_conn_id")
    operator_extra_links = (ChasquiJobLink(),)
    ui_color = "#f4d35e"

    def __init__(
        self,
        *,
        job_id: str | list[str] | Any = None,
        upstream_task_id: str | None = None,
        xcom_key: str = "return_value",
        queue_name: str | None = None,
        chasqui_conn_id: str = ChasquiHook.default_conn_name,
        deferrable: bool | None = None,
        wait_chunk_secs: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (job_id is None) == (upstream_task_id is None):
            raise ValueError("give exactly one of job_id and upstream_task_id")
        self.job_id = job_id
        self.upstream_task_id = upstream_task_id
        self.xcom_key = xcom_key
        self.queue_name = queue_name
        self.chasqui_conn_id = chasqui_conn_id
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        self.wait_chunk_secs = chunk_seconds(wait_chunk_secs)
        self._queue: SyncQueue | None = None
        self._started: float | None = None  # time.monotonic() when this process began waiting

    # ---- ids --------------------------------------------------------------------------
    def _job_ids(self, context: Context) -> tuple[list[str], bool]:
        """``(ids, single)`` from ``job_id`` or the upstream XCom; rejects empty or odd values."""
        value = self.job_id
        if self.upstream_task_id is not None:
            value = context["ti"].xcom_pull(task_ids=self.upstream_task_id, key=self.xcom_key)
        single = isinstance(value, str)
        ids = [value] if single else list(value) if isinstance(value, (list, tuple)) else None
        if not ids or not all(isinstance(j, str) and j for j in ids):
            raise AirflowFailException(f"no Chasqui job id(s) to wait for: got {value!r}")
        return list(dict.fromkeys(cast("list[str]", ids))), single

    # ---- checking ---------------------------------------------------------------------
    def _check(self, ids: list[str], single: bool) -> tuple[str, PokeReturnValue]:
        """One non-blocking look at the stored outcomes; returns ``(queue name, verdict)``.

        A finished check logs what it found (ids, queue, state, attempts, result or reason, and
        how long this task has waited so far), so a wait that never deferred says as much as one
        that did.
        """
        if self._started is None:
            self._started = time.monotonic()
        self._queue = sync_queue = ChasquiHook(self.chasqui_conn_id).get_queue(self.queue_name)
        queue = sync_queue.name
        try:
            outcomes = sync_queue.wait_for_results(ids, timeout=0)
            error = first_error(ids, outcomes, queue)
            done = error is None and len(outcomes) == len(ids)
            event: dict[str, Any] | None = error
            if done:
                event = {"status": "success", "results": {j: outcomes[j].value for j in ids}, "queue": queue}
            if event is not None:  # the wait ended: failed, or every job completed
                log_outcome(self.log, sync_queue, event, ids, waited_seconds(None, self._started))
        finally:
            self._queue = None
            sync_queue.close()
        if error is not None:
            self._log_failure(error)
            raise AirflowFailException(failure_message(error))
        if not done:
            self.log.info("queue %s: %d of %d job(s) finished", queue, len(outcomes), len(ids))
            return queue, PokeReturnValue(False)
        return queue, PokeReturnValue(True, result_from_event(event, ids, single))

    def poke(self, context: Context) -> PokeReturnValue:
        ids, single = self._job_ids(context)
        return self._check(ids, single)[1]

    def execute(self, context: Context) -> Any:
        self._started = time.monotonic()
        if not self.deferrable:
            return super().execute(context)
        # OpenTelemetry (CHASQUI_OTEL=1): the deferral carries the task's span to the trigger; the
        # span continues the upstream enqueue task's trace when that task left one
        with tracing.airflow_task_span(context, lambda: self._upstream_trace(context)) as traceparent:
            return self._execute_deferrable(context, traceparent)

    def _upstream_trace(self, context: Context) -> Any:
        if self.upstream_task_id is None:
            return None
        return context["ti"].xcom_pull(task_ids=self.upstream_task_id, key=tracing.TRACE_XCOM_KEY)

    def _execute_deferrable(self, context: Context, traceparent: str | None) -> Any:
        try:
            ids, single = self._job_ids(context)
            queue, verdict = self._check(ids, single)
        except AirflowFailException as exc:
            if self.soft_fail or self.never_fail:
                raise AirflowSkipException(f"Skipping due to soft_fail/never_fail: {exc}") from exc
            raise
        if verdict.is_done:
            return verdict.xcom_value
        self.log.info(
            "queue %s: deferring to the triggerer to wait for %s (timeout %g s)", queue, ids_text(ids), self.timeout
        )
        trigger = ChasquiJobTrigger(
            job_ids=ids,
            queue_name=queue,
            chasqui_conn_id=self.chasqui_conn_id,
            deadline=time.time() + self.timeout,
            wait_chunk_secs=self.wait_chunk_secs,
            traceparent=traceparent,
        )
        self.defer(trigger=trigger, method_name="execute_complete", timeout=timedelta(seconds=self.timeout))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> Any:
        """Resume after the trigger fired (``resume_execution`` applies soft_fail/never_fail).

        The ids are resolved again from the re-rendered fields rather than carried in the
        defer kwargs, which ``dag.test()`` drops (it resumes with ``{"event": ...}`` only).
        """
        status = (event or {}).get("status")
        job_ids, single = self._job_ids(context) if status == "success" else (None, False)
        log_resumed(self.log, self.chasqui_conn_id, self.queue_name, event, job_ids, context)
        if status == "timeout":
            pending = event["pending"]  # type: ignore[index]
            raise AirflowSensorTimeout(f"Sensor has timed out after {self.timeout} s; still running: {pending}")
        if status == "error":
            self._log_failure(event)  # type: ignore[arg-type]
        with tracing.resume_span(event, self.task_id):
            return result_from_event(event, job_ids, single)

    def _log_failure(self, error: dict[str, Any]) -> None:
        """The task log names the failed job and shows the handler's traceback from the worker."""
        self.log.error("%s", failure_message(error))

    def on_kill(self) -> None:
        """Close the Redis client of a check in progress (the deferred wait holds none here)."""
        queue, self._queue = self._queue, None
        if queue is not None:
            queue.close()
