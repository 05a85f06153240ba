"""What a worker reports to a metrics sink, and the one way it calls one.

:class:`WorkerMetrics` is the protocol (``worker/metrics.py``'s Prometheus sink implements it;
any object with some of its methods will do).  The engine never calls a user's sink directly:
:func:`metrics_sink` wraps it in a :class:`GuardedMetrics`, whose every method calls the sink's
method of that name if it has one (a sink written for an older worker may lack some) and logs
what it raises, since metrics never decide a job's fate; no sink at all is :data:`NO_METRICS`,
a guard around nothing.  Every caller writes ``sink.job_completed(queue, name, seconds)``.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

__all__ = ["WorkerMetrics", "GuardedMetrics", "NO_METRICS", "metrics_sink"]

log = logging.getLogger(__name__)


class WorkerMetrics(Protocol):
    def batch(self, queue: str, n: int) -> None: ...
    def job_completed(self, queue: str, name: str, seconds: float) -> None: ...
    def job_failed(self, queue: str, name: str) -> None: ...
    def job_retried(self, queue: str, name: str) -> None: ...
    def job_dead(self, queue: str, name: str, reason: str) -> None: ...
    def lease_renewed(self, queue: str, entries: int) -> None: ...
    def lease_lost(self, queue: str, entries: int) -> None: ...
    def jobs_stalled(self, queue: str, n: int) -> None: ...
    def task_restarted(self, queue: str, task: str, n: int = 1) -> None: ...
    def promoter_tick(self, queue: str, promoted: int, depth: int, lag_ms: int) -> None: ...
    def scheduler_fire(self, queue: str, fires: int, lag_ms: int) -> None: ...
    def jobs_held(self, queue: str, n: int) -> None: ...
    def handlers_left_running(self, queue: str, n: int) -> None: ...


class GuardedMetrics:
    """A user's sink behind the protocol: missing methods are skipped, errors logged."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def _call(self, method: str, *args: Any) -> None:
        fn = getattr(self.sink, method, None)
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:
            log.exception("metrics sink %s.%s failed", type(self.sink).__name__, method)

    def batch(self, queue: str, n: int) -> None:
        self._call("batch", queue, n)

    def job_completed(self, queue: str, name: str, seconds: float) -> None:
        self._call("job_completed", queue, name, seconds)

    def job_failed(self, queue: str, name: str) -> None:
        self._call("job_failed", queue, name)

    def job_retried(self, queue: str, name: str) -> None:
        self._call("job_retried", queue, name)

    def job_dead(self, queue: str, name: str, reason: str) -> None:
        self._call("job_dead", queue, name, reason)

    def lease_renewed(self, queue: str, entries: int) -> None:
        self._call("lease_renewed", queue, entries)

    def lease_lost(self, queue: str, entries: int) -> None:
        self._call("lease_lost", queue, entries)

    def jobs_stalled(self, queue: str, n: int) -> None:
        self._call("jobs_stalled", queue, n)

    def task_restarted(self, queue: str, task: str, n: int = 1) -> None:
        self._call("task_restarted", queue, task, n)

    def promoter_tick(self, queue: str, promoted: int, depth: int, lag_ms: int) -> None:
        self._call("promoter_tick", queue, promoted, depth, lag_ms)

    def scheduler_fire(self, queue: str, fires: int, lag_ms: int) -> None:
        self._call("scheduler_fire", queue, fires, lag_ms)

    def jobs_held(self, queue: str, n: int) -> None:
        self._call("jobs_held", queue, n)

    def handlers_left_running(self, queue: str, n: int) -> None:
        self._call("handlers_left_running", queue, n)


NO_METRICS: WorkerMetrics = GuardedMetrics(None)
"""No sink: every report is dropped (the worker's per-job path skips it altogether)."""


def metrics_sink(sink: Any) -> WorkerMetrics:
    """``sink`` behind the protocol (already guarded or null: as it is)."""
    if sink is None:
        return NO_METRICS
    if isinstance(sink, GuardedMetrics):
        return sink
    return GuardedMetrics(sink)
