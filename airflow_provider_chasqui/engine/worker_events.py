"""A ``Worker``'s listeners and its own pause (chasquimq's and BullMQ's worker API).

``worker.on(event, callback)`` for ``active`` (job), ``completed`` (job, result), ``failed``
(job, exception: each failed attempt, retried or not), ``progress`` (job, value: each
``update_progress`` of its handlers, pooled ones too), ``stalled`` (job_id, ``"active"``: a
job this worker took over from a consumer that stopped renewing it, a dead or frozen worker;
``QueueEvents.on("stalled")`` hears every worker's), ``drained`` (the queue ran empty),
``paused``, ``resumed``, ``closed`` and ``error`` (exception: Redis unreachable while the worker
starts, or one of its tasks failed and restarts; each is logged as well).  Callbacks run on the worker's loop
(``engine/listeners.py``); ``completed`` fires once the handler returned, before its
acknowledgement is written, so a worker killed between the two runs the job again and the next
run fires it again.  The slots check one bool per job: no listener, no cost.

``worker.pause()`` stops this worker from starting jobs (reading stops; jobs it had read wait,
their leases renewed) until ``worker.resume()``; running jobs finish.  ``Queue.pause`` pauses
every worker of a queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.consumer import UNDECODED, Delivery
from ..types import Job, new_job
from .listeners import Listeners
from .worker_base import WorkerBase

__all__ = ["WorkerEvents", "WORKER_EVENTS"]

WORKER_EVENTS = (
    "active",
    "completed",
    "failed",
    "progress",
    "stalled",
    "drained",
    "paused",
    "resumed",
    "closed",
    "error",
)


class WorkerEvents(WorkerBase):
    """The listeners (``on``/``once``/``off``) and ``pause``/``resume`` of a worker."""

    _listeners: Listeners
    _listening: bool  # any listener: what the per-job paths check
    _paused: bool

    def _init_events(self) -> None:
        self._listeners = Listeners(f"worker of {self.name!r}", WORKER_EVENTS)
        self._listening = False
        self._paused = False

    def on(self, event: str, callback: Callable[..., Any]) -> Callable[..., Any]:
        """Call ``callback`` on each ``event`` (see the module docstring for their arguments);
        an ``async def`` callback runs as a task.  ``ConfigError`` for an unknown event."""
        self._listeners.on(event, callback)
        self._listening = True
        return callback

    def once(self, event: str, callback: Callable[..., Any]) -> Callable[..., Any]:
        self._listeners.once(event, callback)
        self._listening = True
        return callback

    def off(self, event: str, callback: Callable[..., Any] | None = None) -> None:
        self._listeners.off(event, callback)
        self._listening = bool(self._listeners)

    def _error(self, exc: BaseException) -> None:
        """An internal error the worker recovers from, for the ``error`` listeners."""
        if self._listening:
            self._listeners.emit("error", exc)

    def _stalled(self, job_ids: list[str]) -> None:
        """Jobs this worker took over from consumers that stopped renewing them, for the
        ``stalled`` listeners: ``(job_id, "active")`` each, as chasquimq's and BullMQ's."""
        if self._listening:
            for job_id in job_ids:
                self._listeners.emit("stalled", job_id, "active")

    def pause(self) -> None:
        """Start no job until :meth:`resume` (this worker only); running jobs finish."""
        if not self._paused:
            self._paused = True
            self._listeners.emit("paused")

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            self._listeners.emit("resumed")
            if getattr(self, "_deque", None) is not None:  # running: wake the parked slots and the reader
                self._wake(len(self._deque))
                self._room()

    def is_paused(self) -> bool:
        """Paused by :meth:`pause` (not by ``Queue.pause``, which ``Queue.is_paused`` reads)."""
        return self._paused

    def _wake(self, n: int) -> None:
        """Wake up to ``n`` parked slots (``SlotRunner._wake``)."""
        raise NotImplementedError

    @staticmethod
    def _job_view(dl: Delivery) -> Job:
        """The Job a listener gets for a delivery whose handler's Job is not at hand."""
        env, data = dl.envelope, dl.data
        if data is UNDECODED:
            try:
                data = dl.payload()
            except Exception:  # noqa: BLE001 - an undecodable job is shown as its bytes
                data = env.inner
        return new_job(env.id, dl.name, data, env.attempt, env.created_at_ms)
