"""``LeaseGuard``: a worker's leases stay whole while its event loop is blocked (issue 25).

The intake renews every in-flight entry on the event loop (``Intake.run_leases``).  An ``async
def`` handler that blocks the loop (``time.sleep``, a synchronous HTTP client, a CPU-bound
loop: common in data code) stops that renewal, and after the lease another worker would take
the job over and run it a second time while the first still runs.  The guard is a thread with
its own event loop and connection: once the loop's renewal is two intervals late it renews the
in-flight entries (and their concurrency slots) itself, every interval, until the loop catches
up.  A healthy worker's guard only wakes up and looks; it sends nothing.

A paused *process* (SIGSTOP, a VM freeze) pauses the guard too; what keeps a pause shorter than
the lease safe is ``Intake.hold_ms`` (``engine/intake.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from ._driver import AsyncDriver
from .intake import Intake
from .intake_leases import RENEWALS_PER_LEASE, lost_pairs

__all__ = ["LeaseGuard"]

log = logging.getLogger(__name__)
LATE_INTERVALS = 2  # the guard steps in once the loop's renewal is this many intervals late


class LeaseGuard:
    """Renews ``intake``'s leases from a thread while its event loop cannot."""

    def __init__(self, intake: Intake, url: str, loop: asyncio.AbstractEventLoop, **client_kwargs: Any) -> None:
        self.intake, self.loop = intake, loop
        self.interval = intake.lease_ms / 1000 / RENEWALS_PER_LEASE
        self.renewals = 0  # renewals the guard made (the loop was blocked)
        self._url, self._client_kwargs = url, client_kwargs
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LeaseGuard:
        self._thread = threading.Thread(target=self._run, name=f"chasqui-lease-{self.intake.label}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the thread at its next wake-up (it holds nothing worth waiting for)."""
        self._stop.set()

    def _run(self) -> None:
        asyncio.run(self._guard())

    async def _guard(self) -> None:
        driver: AsyncDriver | None = None
        try:
            while not self._stop.wait(self.interval):
                if time.monotonic() - self.intake.renewed_at <= LATE_INTERVALS * self.interval:
                    continue
                try:
                    if driver is None:
                        driver = AsyncDriver(self._url, **self._client_kwargs)
                    await self._renew(driver)
                except Exception as exc:  # noqa: BLE001 - the next interval tries again; the loop logs outages
                    log.warning("%s: lease renewal from the guard thread failed: %s", self.intake.label, exc)
        finally:
            if driver is not None:
                await driver.close()

    async def _renew(self, driver: AsyncDriver) -> None:
        intake = self.intake
        started = time.monotonic()
        try:  # a copy of the loop's sets: atomic under the GIL, retried next time if not
            ids = [eid for eid in list(intake.in_flight) if eid not in intake.lost]
        except RuntimeError:
            return
        if not ids:
            intake.renewed_at = max(intake.renewed_at, started)
            return
        reply: list[Any] = []
        for call in intake.lease_renewals(ids):
            reply += await driver.call(call) or []
        lost = lost_pairs(reply)
        try:  # as in the loop (IntakeLeases.beat): the leases above hold whatever these meet
            for call in intake.flow.slot_renewals([eid for eid in ids if eid not in lost]) + intake.beat_calls():
                await driver.call(call)
        except Exception as exc:  # noqa: BLE001 - refused (out of memory), or the connection failed
            intake.not_renewed("slots or heartbeat (from the guard thread)", exc)
        if lost:  # the loop must learn of them before it trusts its leases again: it renews itself
            self.loop.call_soon_threadsafe(intake.lost_found, lost)
            return
        intake.renewed_at = max(intake.renewed_at, started)
        self.renewals += 1
        if self.renewals == 1 or self.renewals % 100 == 0:
            log.warning(
                "%s: the event loop is blocked (a handler calling blocking code?); the guard thread renewed "
                "%d leases (%d renewals so far)",
                intake.label,
                len(ids),
                self.renewals,
            )
