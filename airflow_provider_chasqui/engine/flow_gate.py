"""``FlowGate``: the intake's obedience to a queue's flow controls (issue 24, ``core/controls.py``).

Between reading a batch and handing it out, the intake asks the gate how much of it may start:
all of it, nothing (the queue is paused, or a handler raised ``RateLimited`` and the queue is
blocked), or what the rate limit grants (``take_rate.lua``).  What may not start yet is *held*:
it stays in the intake's flight (leases renewed, no attempt counted) and is handed out, before
anything new is read, once the controls allow it.

The controls are read at most ``CONTROLS_MAX_AGE_SECS`` before a batch is handed out (a read
per batch put a round trip in every batch's path, about a fifth of the throughput), so a
change is obeyed within 100 ms; while jobs are held they are read afresh each time.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from ..core.consumer import Delivery
from ..core.controls import (
    NO_CONTROLS,
    Controls,
    block_calls,
    controls_calls,
    parse_controls_calls,
    parse_take,
    take_rate_call,
)
from ..core.keys import QueueKeys
from ..errors import TRANSIENT_ERRORS, ChasquiError
from ._driver import AsyncDriver

__all__ = ["FlowGate", "CONTROLS_MAX_AGE_SECS", "PAUSE_POLL_SECS"]

log = logging.getLogger(__name__)

PAUSE_POLL_SECS = 0.25  # how often a worker holding jobs of a paused or blocked queue asks again
CONTROLS_MAX_AGE_SECS = 0.1


class FlowGate:
    """The controls as one consumer obeys them, and the jobs it holds back meanwhile."""

    def __init__(
        self,
        driver: AsyncDriver,
        keys: QueueKeys,
        *,
        label: str,
        take_log: Callable[[], bool],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self.driver, self.keys, self.label = driver, keys, label
        self._take_log, self._sleep = take_log, sleep
        self.held: list[Delivery] = []  # in the intake's flight, not handed out yet
        self.blocked_until = 0.0  # time.monotonic() before which nothing starts (RateLimited, here or elsewhere)
        self._held_until = 0.0  # time.monotonic() before which held jobs wait for the next rate window
        self._known, self._known_at = NO_CONTROLS, float("-inf")

    # ---- the intake's two questions ---------------------------------------------------------
    async def wait_if_blocked(self) -> bool:
        """Sleep a little and say True while the queue is blocked (read nothing then)."""
        blocked = self.blocked_until - time.monotonic()
        if blocked > 0:
            await self._sleep(min(blocked, PAUSE_POLL_SECS))
            return True
        return False

    async def admit(self, ready: list[Delivery]) -> list[Delivery]:
        """The part of a fresh batch that may start now; the rest is held.  Held first, so a
        failing read of the controls (raised) leaves nothing orphaned."""
        self.held += ready
        controls = await self.cached()
        if controls.paused:
            log.info("%s: the queue is paused; holding %d jobs until it resumes", self.label, len(self.held))
            return []
        if self.blocked_until > time.monotonic():
            log.info("%s: the queue is rate limited; holding %d jobs", self.label, len(self.held))
            return []
        n = await self.grant(len(self.held)) if controls.rate is not None else len(self.held)
        out, self.held = self.held[:n], self.held[n:]
        return out

    async def release_held(self, room: int) -> list[Delivery]:
        """Up to ``room`` held jobs, once the controls allow them (``PAUSE_POLL_SECS`` apart
        while paused or blocked, at the next rate window otherwise).  Transient errors raise."""
        wait = self._held_until - time.monotonic()
        if wait > 0:
            await self._sleep(min(wait, PAUSE_POLL_SECS))
            return []
        controls = await self.read()
        if controls.paused or self.blocked_until > time.monotonic():
            await self._sleep(PAUSE_POLL_SECS)
            return []
        n = min(room, len(self.held))
        if controls.rate is not None:
            n = await self.grant(n)
        out, self.held = self.held[:n], self.held[n:]
        return out

    # ---- the controls -----------------------------------------------------------------------
    async def cached(self) -> Controls:
        """The controls as read at most ``CONTROLS_MAX_AGE_SECS`` ago (read now if older)."""
        now = time.monotonic()
        if now - self._known_at > CONTROLS_MAX_AGE_SECS:
            self._known, self._known_at = await self.read(), now
        return self._known

    async def read(self) -> Controls:
        """The controls hash and the block's TTL, in one round trip.  A controls key no worker
        can read (another type, a refused command) is no control: logged, never a crash or a
        stall."""
        try:
            controls = parse_controls_calls(await self.driver.pipeline(controls_calls(self.keys)))
        except TRANSIENT_ERRORS:
            raise
        except ChasquiError as exc:
            if self._take_log():
                log.warning("%s: the queue's controls cannot be read (%s); obeying none", self.label, exc)
            return NO_CONTROLS
        if controls.blocked_ms:
            self.blocked_until = max(self.blocked_until, time.monotonic() + controls.blocked_ms / 1000)
        return controls

    async def grant(self, want: int) -> int:
        """How many of ``want`` jobs the rate limit lets start now; when not all, the held ones
        wait for the window the script named."""
        try:
            granted, wait_ms = parse_take(await self.driver.call(take_rate_call(self.keys, want)), want)
        except TRANSIENT_ERRORS:
            raise
        except ChasquiError as exc:  # a refused script: obey no limit rather than stall
            if self._take_log():
                log.warning("%s: the rate limit cannot be taken (%s); obeying none", self.label, exc)
            return want
        if granted < want:
            self._held_until = time.monotonic() + wait_ms / 1000
        return granted

    # ---- RateLimited --------------------------------------------------------------------------
    async def block(self, ms: int) -> None:
        """Start nothing for ``ms``: here at once, in the other workers once they read the
        controls (within ``CONTROLS_MAX_AGE_SECS``).  A failed write is logged: this one waits."""
        self.blocked_until = max(self.blocked_until, time.monotonic() + ms / 1000)
        if ms <= 0:
            return
        try:
            await self.driver.pipeline(block_calls(self.keys, ms))
        except ChasquiError as exc:
            log.warning("%s: could not tell the other workers to wait %d ms (%s)", self.label, ms, exc)

    def requeue(self, dl: Delivery) -> None:
        """Hand ``dl`` out again later as the same delivery (no attempt counted)."""
        self.held.append(dl)
