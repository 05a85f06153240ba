"""``ProgressReporter``: a worker's handlers report progress; it writes it, coalesced (issue 25).

``Job.update_progress(value)`` (and its sync twin, from a handler's thread) only records the
latest value of the job here (thread-safe: one dict assignment under the GIL); a supervised task
writes whatever was recorded every ``PROGRESS_FLUSH_SECS`` in one pipeline
(``core/running.progress_calls``: the job's progress key and a ``progress`` event), and the
worker's flusher writes it before any outcome, so a finished job's last report is in Redis when
its result is.  So a handler reporting in a tight loop costs one dict store per call, and Redis
at most four writes per second per job.

A handler's ``Job`` reports through its slot's :class:`SlotProgress`, which takes reports only
while that very attempt runs there: once its outcome is decided (or its slot was left behind,
``engine/running_control.py``), a report raises ``RuntimeError`` and writes nothing.  Before,
a task the handler left running, a thread past its timeout or a left-behind handler went on
writing after the job's outcome, over the progress of the job's next attempt (elsewhere, too).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..core.codec import now_ms
from ..core.keys import QueueKeys
from ..core.running import PROGRESS_FLUSH_SECS, attempt_ended, check_progress, progress_calls
from ._driver import AsyncDriver

__all__ = ["ProgressReporter", "SlotProgress"]

log = logging.getLogger(__name__)


class SlotProgress:
    """``Job._progress`` of the jobs one slot runs: reports of the attempt running there now."""

    __slots__ = ("reporter", "job")

    def __init__(self, reporter: ProgressReporter) -> None:
        self.reporter = reporter
        self.job: Any = None  # the Job (a batch: the list of Jobs) whose handler the slot awaits

    def report(self, job: Any, value: Any) -> None:
        """``job.update_progress(value)``; ``RuntimeError`` once that attempt has ended."""
        running = self.job
        if running is not job and not (type(running) is list and any(j is job for j in running)):
            raise attempt_ended(job)
        self.reporter.update(job.id, value)

    def end(self) -> None:
        """The running attempt ended: its Job reports no more."""
        self.job = None


class ProgressReporter:
    """The latest progress of each job of one worker, until written."""

    def __init__(self, driver: AsyncDriver, keys: QueueKeys, events_max: int, label: str) -> None:
        self.driver, self.keys, self.events_max, self.label = driver, keys, events_max, label
        self._latest: dict[str, Any] = {}
        self._writing: asyncio.Future[None] | None = None  # a write in flight (the periodic one, say)

    def update(self, job_id: str, value: Any) -> None:
        # checked (ConfigError to the handler, naming the problem) and packed once, here
        self._latest[job_id] = (value, check_progress(value))

    async def run(self) -> None:
        """Write the recorded values every ``PROGRESS_FLUSH_SECS``, until cancelled."""
        while True:
            await asyncio.sleep(PROGRESS_FLUSH_SECS)
            await self.flush()

    @property
    def pending(self) -> bool:
        """Whether a value waits to be written, or is being written."""
        return bool(self._latest) or self._writing is not None

    async def flush(self) -> None:
        """Write what was recorded; returns once every value recorded before the call is written.
        A write already in flight (the periodic one) is awaited too: it took the values from
        ``_latest``, and an outcome written meanwhile (on another connection) could land first."""
        while self._writing is not None:
            await asyncio.shield(self._writing)
        if not self._latest:
            return
        latest, self._latest = self._latest, {}
        writing = self._writing = asyncio.get_running_loop().create_future()
        try:
            await self.driver.pipeline(progress_calls(self.keys, latest, self.events_max, now_ms()))
        except Exception as exc:  # noqa: BLE001 - progress is best effort, like events
            log.warning("%s: progress of %d jobs not written: %s", self.label, len(latest), exc)
        finally:
            self._writing = None
            writing.set_result(None)
