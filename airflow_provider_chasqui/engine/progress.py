"""``ProgressReporter``: a worker's handlers report progress; it writes it, coalesced (issue 25).

``Job.update_progress(value)`` (and its sync twin, from a handler's thread) only records the
latest value of the job here (thread-safe: one dict assignment under the GIL), as ``job.log``
records a line; a supervised task writes what was recorded in one pipeline
(``core/running.progress_calls``: the job's progress key and a ``progress`` event; the log
lines), at once when nothing was waiting (the first report shows without delay), then at most
every ``PROGRESS_FLUSH_SECS``; and the worker's flusher writes it before any outcome, so a
finished job's last report is in Redis when its result is.  So a handler reporting in a tight
loop costs one dict store per call, and Redis at most four writes per second per worker.

A handler's ``Job`` reports through its slot's :class:`SlotProgress`, which takes reports only
while that very attempt runs there: once its outcome is decided (or its slot was left behind,
``engine/running_control.py``), a report raises ``RuntimeError`` and writes nothing.  Before,
a task the handler left running, a thread past its timeout or a left-behind handler went on
writing after the job's outcome, over the progress of the job's next attempt (elsewhere, too).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from ..core.codec import now_ms
from ..core.job_logs import MAX_LOG_LINES, check_log_line, log_calls
from ..core.keys import QueueKeys
from ..core.running import PROGRESS_FLUSH_SECS, attempt_ended, check_progress, progress_calls
from ._driver import AsyncDriver

__all__ = ["PoolProgress", "ProgressReporter", "SlotProgress"]

log = logging.getLogger(__name__)


class SlotProgress:
    """``Job._progress`` of the jobs one slot runs: reports of the attempt running there now."""

    __slots__ = ("reporter", "worker", "job")

    def __init__(self, reporter: ProgressReporter, worker: Any = None) -> None:
        self.reporter = reporter
        self.worker = worker  # its listeners hear each report (engine/worker_events.py)
        self.job: Any = None  # the Job (a batch: the list of Jobs) whose handler the slot awaits

    def _check_running(self, job: Any) -> None:
        running = self.job
        if running is not job and not (type(running) is list and any(j is job for j in running)):
            raise attempt_ended(job)

    def report(self, job: Any, value: Any) -> None:
        """``job.update_progress(value)``; ``RuntimeError`` once that attempt has ended."""
        self._check_running(job)
        self.reporter.update(job.id, value, job.name)
        worker = self.worker
        if worker is not None and worker._listening:
            worker._listeners.emit("progress", job, value)

    def log(self, job: Any, line: Any) -> None:
        """``job.log(line)``; ``RuntimeError`` once that attempt has ended."""
        self._check_running(job)
        self.reporter.log(job.id, check_log_line(line))

    def end(self) -> None:
        """The running attempt ended: its Job reports no more."""
        self.job = None


class PoolProgress:
    """What a process pool's children report (``engine/process_pool.py``): recorded as an
    in-process handler's reports are, and heard by the worker's ``progress`` listeners with the
    job whose call is running (``Worker._running_job``)."""

    __slots__ = ("reporter", "worker")

    def __init__(self, reporter: ProgressReporter, worker: Any) -> None:
        self.reporter, self.worker = reporter, worker

    def update(self, job_id: str, value: Any, name: str = "") -> None:
        self.reporter.update(job_id, value, name)
        worker = self.worker
        if worker._listening and (job := worker._running_job(job_id)) is not None:
            worker._listeners.emit("progress", job, value)

    def log(self, job_id: str, line: str) -> None:
        self.reporter.log(job_id, line)


class ProgressReporter:
    """The latest progress of each job of one worker, until written."""

    def __init__(self, driver: AsyncDriver, keys: QueueKeys, events_max: int, label: str) -> None:
        self.driver, self.keys, self.events_max, self.label = driver, keys, events_max, label
        self._latest: dict[str, Any] = {}
        self._lines: dict[str, list[str]] = {}  # log lines not yet written (core/job_logs.py)
        self._writing: asyncio.Future[None] | None = None  # a write in flight (the periodic one, say)
        self._recorded = asyncio.Event()  # set when a value or line waits: the writer wakes
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def update(self, job_id: str, value: Any, name: str = "") -> None:
        # checked (ConfigError to the handler, naming the problem) and packed once, here
        first = not self.recorded
        self._latest[job_id] = (value, check_progress(value), name)
        if first:
            self._wake()

    def _wake(self) -> None:
        """Wake the writer (from a handler's thread through the loop)."""
        if threading.get_ident() == self._thread:
            self._recorded.set()
        elif not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._recorded.set)

    def log(self, job_id: str, line: str) -> None:
        """Record a checked log line (``core/job_logs.check_log_line``); only the newest
        ``MAX_LOG_LINES`` of a job wait for the write."""
        first = not self.recorded
        lines = self._lines.setdefault(job_id, [])
        lines.append(line)
        if first:
            self._wake()
        if len(lines) > 2 * MAX_LOG_LINES:
            del lines[:-MAX_LOG_LINES]

    async def run(self) -> None:
        """Write what is recorded as it comes, at most every ``PROGRESS_FLUSH_SECS``, until cancelled."""
        while True:
            await self._recorded.wait()
            self._recorded.clear()
            await self.flush()
            await asyncio.sleep(PROGRESS_FLUSH_SECS)
            if self.recorded:  # recorded during the pause: the writer's next turn
                self._recorded.set()

    @property
    def recorded(self) -> bool:
        """Whether a value or a line waits to be written (the first one wakes the writer)."""
        return bool(self._latest) or bool(self._lines)

    @property
    def pending(self) -> bool:
        """Whether a value waits to be written, or is being written."""
        return self.recorded or self._writing is not None

    async def flush(self) -> None:
        """Write what was recorded; returns once every value recorded before the call is written.
        A write already in flight (the periodic one) is awaited too: it took the values from
        ``_latest``, and an outcome written meanwhile (on another connection) could land first."""
        while self._writing is not None:
            await asyncio.shield(self._writing)
        if not self.recorded:
            return
        latest, self._latest = self._latest, {}
        lines, self._lines = self._lines, {}
        writing = self._writing = asyncio.get_running_loop().create_future()
        try:
            calls = progress_calls(self.keys, latest, self.events_max, now_ms()) + log_calls(self.keys, lines)
            await self.driver.pipeline(calls)
        except Exception as exc:  # noqa: BLE001 - progress is best effort, like events
            log.warning("%s: progress and logs of %d jobs not written: %s", self.label, len(latest) + len(lines), exc)
        finally:
            self._writing = None
            writing.set_result(None)
