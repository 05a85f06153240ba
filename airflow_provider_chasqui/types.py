"""Public value types shared by the asyncio and blocking APIs.

``Job`` and ``BackoffSpec`` keep the chasquimq package's shapes so code written for it
runs unchanged; they are frozen and safe to share between tasks and threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

# BackoffSpec and its helpers live in the core (which never imports upward); the public home is here
from .core.backoff import BACKOFF_KINDS, BackoffSpec, build_retry_override, coerce_backoff
from .core.failure import JobFailure
from .core.fast import fast_constructor
from .errors import ConfigError

if TYPE_CHECKING:
    from .engine.queue import Queue

__all__ = [
    "Job",
    "JobFailure",
    "BackoffSpec",
    "QueueEvent",
    "coerce_backoff",
    "build_retry_override",
    "new_job",
    "BACKOFF_KINDS",
]


@dataclass(frozen=True)
class Job:
    """One job as a handler sees it (and as ``Queue.add`` returns it)."""

    id: str
    name: str
    data: Any
    attempt: int
    created_at_ms: int
    _queue: Queue | None = field(default=None, repr=False, compare=False, hash=False)
    _progress: Any = field(default=None, repr=False, compare=False, hash=False)  # its worker slot's progress sink
    # the latest progress its handler reported, on a Job read back (Queue.get_job, get_jobs); None otherwise
    progress: Any = field(default=None, compare=False, hash=False)
    # on a running Job read back: the times its stream entry was taken over from a consumer that
    # stopped renewing it (chasquimq's stalled count; 0: never); None for a job not running
    stalled_count: int | None = field(default=None, compare=False, hash=False)

    @property
    def attempts_made(self) -> int:
        return self.attempt

    async def update_progress(self, value: Any) -> None:
        """Report this job's progress from its handler: a finite number (a percentage shows as a
        bar) or a small dict (at most 1 KiB packed); ``ConfigError`` otherwise.  Kept with the job
        and sent as a ``progress`` event, coalesced: the worker writes the latest value of each
        job at most every 0.25 s (docs/running-jobs.md).  Returns at once; ``RuntimeError`` once
        this attempt has ended."""
        self.update_progress_sync(value)

    def update_progress_sync(self, value: Any) -> None:
        """:meth:`update_progress` for a plain (non-async) handler, from its thread.
        ``RuntimeError`` once this attempt has ended (a task or thread the handler left running,
        a handler past its timeout or cancel): a report then would land after the job's outcome."""
        if self._progress is None:
            raise RuntimeError(_READ_ONLY.format("update_progress"))
        self._progress.report(self, value)

    async def log(self, line: str) -> None:
        """Add a line to this job's log (``Queue.get_job_logs``, ``chasqui job show``): a str of
        at most 16 KiB characters, ``ConfigError`` otherwise; the newest 1000 lines are kept a
        day.  Written with the progress (at most every 0.25 s, before the job's outcome);
        ``RuntimeError`` once this attempt has ended, or on a Job that is no handler's."""
        self.log_sync(line)

    def log_sync(self, line: str) -> None:
        """:meth:`log` for a plain (non-async) handler, from its thread."""
        if self._progress is None:
            raise RuntimeError(_READ_ONLY.format("log"))
        self._progress.log(self, line)

    async def wait_for_result(self, timeout: float = 30.0, **_compat: Any) -> Any:
        """Block on Redis until the job completes; return the handler's result.

        Raises ``JobFailed`` if it went to the DLQ and ``TimeoutError`` on the deadline.
        ``poll_interval`` (chasquimq 1.3 polls) is checked and has nothing to tune: the wait
        blocks on the events stream and wakes on the outcome.
        """
        unknown = set(_compat) - {"poll_interval"}
        if unknown:
            raise TypeError(f"unexpected keyword arguments: {sorted(unknown)}")
        if not _positive_seconds(timeout):
            raise ConfigError(f"timeout must be a positive finite number of seconds, got {timeout!r}")
        poll = _compat.get("poll_interval")
        if poll is not None and not _positive_seconds(poll):
            raise ConfigError(f"poll_interval must be a positive finite number of seconds, got {poll!r}")
        if self._queue is None:
            raise RuntimeError(
                "wait_for_result requires a Queue reference: use the Job that Queue.add/add_bulk returned"
            )
        return await self._queue.wait_for_result(self.id, timeout=timeout)

    async def wait_until_finished(self, events: Any = None, timeout: float = 30.0) -> Any:
        """chasquimq's (and BullMQ's) name for :meth:`wait_for_result`: the result, ``JobFailed``
        (a ``RuntimeError``) if it was dead-lettered, ``TimeoutError`` at the deadline.
        ``events`` (a ``QueueEvents`` of the job's queue) is checked and not needed: the wait
        follows the events stream itself."""
        mine = self._queue.name if self._queue is not None else None
        theirs = getattr(events, "name", None)
        if events is not None and (not isinstance(theirs, str) or (mine is not None and theirs != mine)):
            raise ConfigError(f"events must be a QueueEvents of queue {mine!r}, got {type(events).__name__} {theirs!r}")
        return await self.wait_for_result(timeout)


_READ_ONLY = "this Job is read-only (from a producer or a lookup): {} works inside a worker's handler"


def _positive_seconds(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


# ``Job(id, name, data, attempt, created_at_ms, _queue=None)`` for the per-job hot paths
# (producers' returns, the worker's deliveries); see ``core.fast``
new_job = fast_constructor(Job)


@dataclass(frozen=True)
class QueueEvent:
    """One entry of ``{chasqui:<q>}:events`` (numeric values stay strings, as in chasquimq)."""

    name: str
    job_id: str | None
    job_name: str
    fields: dict[str, str]
    ts_ms: int = 0
    event_id: str = ""
