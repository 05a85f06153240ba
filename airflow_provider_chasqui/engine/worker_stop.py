"""How a ``Worker`` stops: the bounded steps after ``close()`` or a cancel of ``run()``.

Split from ``engine/worker.py`` (its docstring tells the whole story): reading stops first (the
pending read unblocked), the background loops are told to stop, the handlers get
``shutdown_deadline_secs``, the last progress reports and acks are written while the leases
are still renewed, then the leases, the loops and the connections end.  Every step is bounded,
so a stop ends even when Redis went silent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from .cancellation import unblock_until_done
from .lease_guard import LeaseGuard
from .supervision import STOP_GRACE_SECS, settle_tasks
from .worker_base import log
from .worker_slots import SlotRunner

__all__ = ["WorkerStop"]


class WorkerStop(SlotRunner):
    """The stop sequence of a ``Worker`` (the state it reads: ``WorkerBase``)."""

    _guard: LeaseGuard  # renews the leases from a thread while the loop is blocked

    async def _shutdown(self, *tasks: Any) -> None:
        """The stop (``_drain``'s steps), after close() or a cancel of run(): a cancelled run()
        stops as close() does (without this it waited out every deadline of the stop, 40 s for
        an idle worker, with its reader and slots still on); a second cancel cuts it short but
        no lease outlives it."""
        assert self._stopping is not None
        self._stopping.set()
        try:
            await self._drain(*tasks)
        finally:
            self._guard.stop()

    async def _drain(
        self,
        reader: asyncio.Task[None],
        slots: list[asyncio.Task[None]],
        flusher: asyncio.Task[None],
        background: list[tuple[Any, asyncio.Task[None]]],
        leaser: asyncio.Task[None],
    ) -> None:
        s = self.settings
        label = f"worker {self.consumer_id}"
        # every step is bounded: a stop ends even when Redis went silent (a paused server)
        grace = min(STOP_GRACE_SECS, max(1.0, s.shutdown_deadline_secs))
        await self._within(unblock_until_done(reader, self._intake.unblock), "its reader's unblock", grace)
        await settle_tasks([reader], label, cancel=False, grace=grace)
        for lp, task in background:
            if lp is None:
                task.cancel()
            else:
                lp.stop()
        self._wake_all()
        for task in self._left_behind:  # their jobs are settled; one more cancel, not waited for
            task.cancel()
        if self._left_behind:
            log.warning("%s: %d handlers that ignored their cancellation still running", label, len(self._left_behind))
        live = [t for t in slots if t not in self._left_behind]
        _done, late = await asyncio.wait(live, timeout=s.shutdown_deadline_secs) if live else ((), ())
        if late:  # their entries stay pending and are reclaimed later: nothing is lost
            log.warning("%s: %d handlers still running at the shutdown deadline", label, len(late))
            await settle_tasks(list(late), label, cancel=True, grace=grace)
        if self._procs is not None:
            await self._procs.close()
        await self._within(self._progress.flush(), "the last progress reports", grace)  # before the outcomes
        self._final_flush = True
        self._flush_wanted.set()
        # the acks of every handler that finished; past the grace their entries stay pending and
        # are reclaimed after the lease (run again, never at once: the leases stop with us)
        await settle_tasks([flusher], label, cancel=False, grace=max(grace, s.claim_min_idle_ms / 1000))
        for task in tuple(self._emits):  # only left when Redis went silent: events are best effort
            task.cancel()
        self._guard.stop()
        # the leases were renewed until the last ack was written; background loops end here
        await settle_tasks([leaser], label, cancel=True, grace=grace)
        await settle_tasks([t for _lp, t in background], label, cancel=False, grace=grace)
        # a clean stop's goodbye; without it the heartbeat lapses and a janitor reaps us
        await self._within(self._intake.leave(), "its leave", grace)
        suppressed = self._fail_log.take_suppressed()
        if suppressed:
            self._intake.log_suppressed(suppressed)
        self._executor.shutdown(wait=False, cancel_futures=True)
        await self._within(self._intake.close(), "closing its reader", grace)
        await self._within(self.driver.close(), "closing its connections", grace)
        log.info("worker %s stopped after %d jobs", self.consumer_id, self.processed)

    async def _within(self, aw: Awaitable[Any], what: str, grace: float) -> None:
        """``aw``, given up (with a warning) after ``grace`` seconds."""
        try:
            await asyncio.wait_for(aw, grace)
        except TimeoutError:
            log.warning("worker %s: %s took over %.1f s: given up", self.consumer_id, what, grace)
