"""A leader-locked periodic loop: the shared shape of the promoter and the scheduler.

Every tick renews (or takes) the lock with the ChasquiMQ acquire script, so a dead leader's
lock lapses within its TTL and another process takes over; work runs only while leading.
Redis outages are retried with capped backoff and never end the loop.  A leader whose lock
renewals succeed while its ticks keep failing on connection errors for a whole lock TTL has
a problem of its own (a broken connection, a stuck client): it releases the lock and stays
out for one TTL so a healthy process takes over, instead of holding the lock for ever.  A
renewal that fails (a connection gone silent times out: every client has a socket timeout)
ends the leadership at once: the lock lapses within its TTL and another process takes it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid

from ..core.calls import int_reply, script_call
from ..core.keys import check_consumer_name
from ..core.pacing import LogBudget
from ..core.settings import MAX_MS, check_int
from ..errors import TRANSIENT_ERRORS, ChasquiError
from ._driver import AsyncDriver

__all__ = ["LeaderLoop", "TRANSIENT"]

log = logging.getLogger(__name__)
TICK_ERRORS_LOGGED, TICK_ERRORS_WINDOW_SECS = 3, 60.0  # failed ticks logged per window
# What a leader-locked loop waits out: the drivers' typed transient errors (a lost connection,
# a write on a replica, a cluster failing over) and a raw socket error (an OSError).
TRANSIENT: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, OSError)


class LeaderLoop:
    """Subclasses set ``lock_key`` and implement ``tick()``: True = run again now, False =
    sleep one interval, a number = sleep that many seconds (at most one interval)."""

    role = "leader"
    interval_arg = "interval_ms"  # what the subclass's constructor calls it, for its errors

    def __init__(
        self,
        driver: AsyncDriver,
        lock_key: str,
        *,
        holder: str | None = None,
        interval_ms: int = 100,
        lock_ttl_secs: int = 5,
    ) -> None:
        self.driver = driver
        self.lock_key = lock_key
        self.holder = f"{self.role[0]}-{uuid.uuid4()}" if holder is None else check_consumer_name(holder, "holder")
        self.interval = check_int(self.interval_arg, interval_ms, 1, MAX_MS) / 1000
        self.lock_ttl_secs = check_int("lock_ttl_secs", lock_ttl_secs, 1, MAX_MS // 1000)
        self.is_leader = False
        self._stop = asyncio.Event()

    async def tick(self) -> bool | float:
        raise NotImplementedError

    def stop(self) -> None:
        self._stop.set()

    async def _acquire(self) -> bool:
        reply = await self.driver.call(script_call("acquire_lock", (self.lock_key,), (self.holder, self.lock_ttl_secs)))
        leader = int_reply(reply) == 1
        if leader != self.is_leader:
            log.info("%s %s %s lock %s", self.role, self.holder, "acquired" if leader else "lost", self.lock_key)
        self.is_leader = leader
        return leader

    async def run(self) -> None:
        failures = 0
        failing_since: float | None = None  # first of the ticks in a row that failed right after a renewal
        loop = asyncio.get_running_loop()
        # a tick refused every time (a spoiled or full stream) is said a few times a minute, not
        # at every tick, with the count of those not logged
        said = LogBudget(TICK_ERRORS_LOGGED, TICK_ERRORS_WINDOW_SECS)
        try:
            while not self._stop.is_set():
                again: bool | float = False
                leading = False
                try:
                    leading = await self._acquire()
                    if leading:
                        again = await self.tick()
                    failures = 0
                    failing_since = None
                except TRANSIENT as exc:
                    failures += 1
                    log.warning("%s %s: Redis unavailable (%s); retrying", self.role, self.holder, exc)
                    if not leading:  # the renewal itself failed: Redis is down, or silent to this process
                        failing_since = None
                        if self.is_leader:  # the lock lapses within its TTL; another process may take it
                            log.warning("%s %s lost lock %s: renewal failed", self.role, self.holder, self.lock_key)
                            self.is_leader = False
                    elif failing_since is None:
                        failing_since = loop.time()
                    elif loop.time() - failing_since >= self.lock_ttl_secs:
                        failing_since = None
                        await self._step_down(exc)
                        continue
                    await self._sleep(min(0.05 * 2 ** min(failures, 6), 2.0))
                    continue
                except ChasquiError as exc:
                    may, before = said.take()
                    if before:
                        log.error("%s %s: %d more failed ticks were not logged", self.role, self.holder, before)
                    if may:
                        log.error("%s %s tick failed: %s", self.role, self.holder, exc)
                if isinstance(again, (int, float)) and not isinstance(again, bool):
                    await self._sleep(max(0.0, min(float(again), self.interval)))
                elif again is not True:
                    await self._sleep(self.interval)
        finally:
            await self._release()

    async def _sleep(self, seconds: float) -> None:
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            pass

    async def _step_down(self, exc: BaseException) -> None:
        """Hand the lock over: this leader renews it but cannot work (see the module docstring)."""
        log.error(
            "%s %s: every tick failed for %d s while the lock renewed (%s); releases %s and stays out %d s",
            self.role,
            self.holder,
            self.lock_ttl_secs,
            exc,
            self.lock_key,
            self.lock_ttl_secs,
        )
        try:
            await self._release()
        except ChasquiError as err:  # it lapses within its TTL anyway
            log.warning("%s %s could not release %s: %s", self.role, self.holder, self.lock_key, err)
        self.is_leader = False
        await self._sleep(self.lock_ttl_secs)

    async def _release(self) -> None:
        if not self.is_leader:
            return
        try:
            await self.driver.call(script_call("release_lock", (self.lock_key,), (self.holder,)))
        except TRANSIENT as exc:
            log.warning("%s %s could not release %s: %s", self.role, self.holder, self.lock_key, exc)
        self.is_leader = False
