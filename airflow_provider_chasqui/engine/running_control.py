"""Stopping running jobs: ``Queue.cancel``'s watcher, and slots a handler will not give back.

A running job is stopped through its slot: at its deadline (``_bounded`` in
``engine/worker_slots.py``) or on ``Queue.cancel`` the slot's task is cancelled, so an
``async def`` handler sees ``CancelledError`` at its current ``await``.  One that swallows it (a
bare ``except:`` in a retry loop) would keep its slot, and its job, for as long as it ran: with
``concurrency=1`` the whole queue waited behind it, and ``asyncio.run`` never returned.  So
``LEAVE_BEHIND_MS`` after the cancel such a slot is *left behind*: its job is settled as a
handler that let the cancel through would have had it (failed with reason ``timeout``, or
``cancelled``), a new slot takes its place, and the old one, when its handler ends at last,
settles nothing and ends.  Python cannot stop a coroutine that refuses, as it cannot stop a
thread (``_abandon_thread``): it runs on beside the worker, counted and logged.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..core.consumer import Delivery
from ..core.running import CANCEL_POLL_SECS, LEAVE_BEHIND_MS
from ..errors import TRANSIENT_ERRORS, JobTimeout
from .progress import SlotProgress
from .worker_base import log
from .worker_outcomes import OutcomeWriter

__all__ = ["LeftBehind", "RunningControl"]


class LeftBehind(BaseException):
    """Raised in a left-behind slot once its handler ends: its job was settled without it."""


class RunningControl(OutcomeWriter):
    """Cancels running jobs and leaves stuck slots behind (see the module docstring)."""

    _slots: list[asyncio.Task[None]]  # the slot tasks, a left-behind one's replacement included
    _timed: dict[Any, tuple[tuple[Delivery, ...], int, int]]  # slot -> (its jobs, timeout ms, start ns)
    _cancel_sent: dict[Any, float]  # slot -> when Queue.cancel cancelled it
    _left_behind: dict[Any, str]  # slots whose handler ignored its cancellation, still running -> their job's outcome
    _slot_progress: dict[Any, SlotProgress]  # slot task -> the progress sink of its jobs
    _threads_left: set[Future[Any]]  # plain handlers' thread calls stopped while running: they run on
    _left_reported: int  # the left_running count last given to the metrics sink

    @property
    def left_running(self) -> int:
        """Handlers still running whose job was ended without them: ``async def`` handlers
        left behind, and plain handlers' threads that ran on past their timeout or cancel.
        Each holds what it holds (memory, connections) until it ends; the count is in the
        worker's heartbeat (``chasqui workers``, the dashboard), in ``health()`` and in the
        ``handlers_left_running`` metric.  0 before the first ``run()``."""
        return len(getattr(self, "_left_behind", ())) + len(getattr(self, "_threads_left", ()))

    def _run_on(self, call: Future[Any]) -> None:
        """A plain handler's thread call was stopped while its thread runs: counted until it ends."""
        self._threads_left.add(call)
        call.add_done_callback(self._threads_left.discard)  # from its thread (or at once if done)

    def _report_left_running(self) -> None:
        n = self.left_running
        if n != self._left_reported:
            self._left_reported = n
            self._sink.handlers_left_running(self.name, n)

    async def _watch_cancels(self) -> None:
        """Every ``CANCEL_POLL_SECS``: leave behind the slots whose handler outlived its cancel;
        while handlers run on a queue with cancel requests, look the running jobs up and cancel
        the slot of each requested one (its handler gets ``CancelledError``; a thread runs on).
        Costs nothing on a queue never cancelled whose jobs have no timeout."""
        flow = self._intake.flow
        while True:
            await asyncio.sleep(CANCEL_POLL_SECS)
            if self._timed or self._cancel_sent:
                await self._leave_stuck_slots()
            self._report_left_running()
            if not self._deque and not self._pooled and not any(self._current.values()):
                continue
            try:
                if not (await flow.cached()).cancels:
                    continue
                running = {task: dl for task, dl in self._current.items() if dl is not None}
                pooled = [(call, dl) for call, (dl, _start) in self._pooled.items() if not call.finished]
                ids = [dl.envelope.id for dl in running.values()] + [dl.envelope.id for dl in self._deque]
                hit = await flow.cancelled_ids(ids + [dl.envelope.id for _call, dl in pooled])
            except TRANSIENT_ERRORS:
                continue  # the reader waits the outage out and logs it
            if not hit:
                continue
            for call, dl in pooled:  # taken back, or its child killed; its slot ends it cancelled
                if dl.envelope.id in hit and self._procs is not None:
                    self._procs.cancel(call)
            for task, dl in running.items():
                if dl.envelope.id in hit and self._current.get(task) is dl and task not in self._cancel_target:
                    self._cancel_target[task] = dl
                    self._cancel_sent[task] = time.monotonic()
                    task.cancel()
            queued = [dl for dl in self._deque if dl.envelope.id in hit]  # read ahead, not started
            if queued:
                keep = [dl for dl in self._deque if dl.envelope.id not in hit]
                self._deque.clear()  # in place: the slots hold this deque
                self._deque.extend(keep)
                await self._emitted()  # their `active` events first
                await self._intake.settle_cancelled(queued)
                self._room()

    async def _leave_stuck_slots(self) -> None:
        """Leave behind each slot still in its handler ``LEAVE_BEHIND_MS`` after its deadline
        or its ``Queue.cancel``; forget the cancels the slots already acted on."""
        now, clock = time.monotonic(), time.perf_counter_ns()
        for task, (dls, limit_ms, start) in list(self._timed.items()):
            duration_us = (clock - start) // 1000
            # a cancelled one is left behind as cancelled (below), not failed for its timeout
            if duration_us >= (limit_ms + LEAVE_BEHIND_MS) * 1000 and task not in self._cancel_target:
                outcomes = [self._failed(dl, JobTimeout(limit_ms, dl.envelope.id), duration_us) for dl in dls]
                self._leave_behind(task, dls[0], f"ran past its timeout of {limit_ms} ms", outcomes[0])
        for task, sent in list(self._cancel_sent.items()):
            dl = self._cancel_target.get(task)
            if dl is None or task in self._left_behind:  # its slot took the cancel, or already left
                del self._cancel_sent[task]
            elif now - sent >= LEAVE_BEHIND_MS / 1000:
                self._leave_behind(task, dl, "was cancelled", "cancelled")
                await self._job_cancelled(dl, True)

    def _leave_behind(self, task: Any, dl: Delivery, what: str, outcome: str) -> None:
        """Hand ``task``'s place to a new slot; ``task`` settles nothing more (``LeftBehind``)."""
        self._left_behind[task] = outcome  # its span ends so once its handler does
        sink = self._slot_progress.pop(task, None)
        if sink is not None:  # its handler's reports from now on raise, write nothing
            sink.end()
        self._timed.pop(task, None)
        self._cancel_sent.pop(task, None)
        self._current.pop(task, None)  # no cancel looks it up again
        self._slots.append(self._tasks.start("slots", self._slot, f"chasqui-slot-after-{len(self._left_behind)}"))
        log.warning(
            "worker %s: job %s %s %s and its handler ignored the cancellation for %.0f s: it is settled "
            "without it, a new slot takes its place, and the handler runs on (%d such now); let "
            "CancelledError through, or use --processes, which kills",
            self.consumer_id,
            dl.envelope.id,
            dl.name,
            what,
            LEAVE_BEHIND_MS / 1000,
            len(self._left_behind),
        )

    def _forget_slot(self, task: Any) -> str:
        """A left-behind slot's handler ended at last: drop what the worker held about it, and
        say what its job's outcome was (for its span)."""
        self._current.pop(task, None)
        self._cancel_target.pop(task, None)
        return self._left_behind.pop(task)

    async def _slot(self) -> None:
        """The slot loop: ``SlotRunner._slot`` (``engine/worker_slots.py``)."""
        raise NotImplementedError

    async def _job_cancelled(self, dl: Delivery, is_async: bool) -> None:
        """A running job was cancelled (``Queue.cancel``): it ends ``cancelled``, never retried."""
        if not is_async and self._procs is None:  # a pool process running it was killed instead
            self._abandon_thread(dl.envelope.id)
        log.info("worker %s: job %s %s cancelled while running", self.consumer_id, dl.envelope.id, dl.name)
        if self._intake.owned([(dl.entry_id,)], 0):
            try:
                await self._emitted()  # its `active` event first
                await self._intake.settle_cancelled([dl])
            except Exception as exc:  # noqa: BLE001 - the entry stays pending: reclaimed, then cancelled
                log.warning("worker %s: job %s could not be ended cancelled: %s", self.consumer_id, dl.envelope.id, exc)
        self._room()
        self._count_processed()

    def _abandon_thread(self, job_id: str) -> None:
        """A plain handler ran past its timeout (or was cancelled) in a pool thread that cannot be
        stopped: later jobs get a fresh pool of the same size, so a stuck thread never takes capacity away (the
        old pool ends with its last thread)."""
        old = self._executor
        self._executor = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix=f"chasqui-{self.name}")
        old.shutdown(wait=False)
        log.warning(
            "worker %s: job %s ended (timeout or cancel) in a thread that runs on (%d handler(s) running "
            "on now); use an async handler to stop such jobs",
            self.consumer_id,
            job_id,
            self.left_running,
        )
