"""``FlowGate``: the intake's obedience to a queue's flow controls (issue 24, ``core/controls.py``).

Between reading a batch and handing it out, the intake asks the gate how much of it may start:
all of it, nothing (the queue is paused, or a handler raised ``RateLimited`` and the queue is
blocked), or what the concurrency and rate limits grant together (``take_starts.lua``).  What
may not start yet is *held*: it stays in the intake's flight (leases renewed, no attempt
counted) and is handed out, before anything new is read, once the controls allow it.

A job started under a concurrency limit holds a slot (:attr:`FlowGate.slotted`), and a job of a
group with a concurrency limit its group's slot, taken when it was moved to the stream
(:attr:`FlowGate.grouped`, ``core/groups.py``): both are renewed with the leases
(:meth:`FlowGate.renew_slots`) and freed in the same round trip that settles the job
(:meth:`FlowGate.free`).  A job held for a slot is offered again as soon as this worker frees
one, and every ``SLOT_POLL_SECS`` for the slots other workers free.

The controls are read at most ``CONTROLS_MAX_AGE_SECS`` before a batch is handed out (a read
per batch put a round trip in every batch's path, about a fifth of the throughput), so a
change is obeyed within 100 ms; while jobs are held they are read afresh each time.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable

from ..core.calls import Call
from ..core.codec import now_ms
from ..core.consumer import Delivery
from ..core.controls import (
    CONTROLS_MAX_AGE_MS,
    NO_CONTROLS,
    Controls,
    block_calls,
    controls_calls,
    free_slots_call,
    parse_controls_calls,
    parse_take,
    renew_slots_call,
    take_starts_call,
)
from ..core.keys import QueueKeys
from ..core.running import parse_cancels, parse_timeout, read_cancels_call, read_timeouts_call
from ..errors import TRANSIENT_ERRORS, ChasquiError
from ._driver import AsyncDriver
from .cancellation import raise_if_cancelling
from .metrics import NO_METRICS, WorkerMetrics

__all__ = ["FlowGate", "CONTROLS_MAX_AGE_SECS", "GRANT_LOGGED", "PAUSE_POLL_SECS", "SLOT_POLL_SECS"]

log = logging.getLogger(__name__)

PAUSE_POLL_SECS = 0.25  # how often a worker holding jobs of a paused or blocked queue asks again
CONTROLS_MAX_AGE_SECS = CONTROLS_MAX_AGE_MS / 1000
SLOT_POLL_SECS = 0.05  # how often a worker holding jobs for a concurrency slot asks again
RENEW_CHUNK = 1000  # entry ids per renew_slots call
# FlowGate.grant's DEBUG line, (granted, server ms): what the rate limit's tests and
# benchmarks/bench_rate_limit.py add up per window
GRANT_LOGGED = re.compile(r"(\d+) of \d+ starts granted at server time (\d+) ms")


class FlowGate:
    """The controls as one consumer obeys them, and the jobs it holds back meanwhile."""

    def __init__(
        self,
        driver: AsyncDriver,
        keys: QueueKeys,
        *,
        lease_ms: int,
        label: str,
        take_log: Callable[[], bool],
        sleep: Callable[[float], Awaitable[None]],
        metrics: WorkerMetrics = NO_METRICS,
    ) -> None:
        self.driver, self.keys, self.label, self.lease_ms = driver, keys, label, lease_ms
        self._take_log, self._sleep = take_log, sleep
        self.held: list[Delivery] = []  # in the intake's flight, not handed out yet
        self.unchecked: list[Delivery] = []  # held before their cancels and timeouts were read (an outage)
        self.slotted: set[bytes] = set()  # entries holding a concurrency slot until they settle
        self.grouped: dict[bytes, bytes] = {}  # entries of a job group -> the group (its slot, if limited)
        self.timed: dict[bytes, str] = {}  # entries whose job has its own timeout -> the job id
        self.to_cancel: list[Delivery] = []  # read, cancelled before they started: the intake settles them
        self._freed: asyncio.Event | None = None  # set when this worker frees a slot
        self._slot_bound = False  # the held jobs wait for a slot (not for a rate window)
        self.blocked_until = 0.0  # time.monotonic() before which nothing starts (RateLimited, here or elsewhere)
        self._held_until = 0.0  # time.monotonic() before which held jobs wait for the next rate window
        self._known, self._known_at = NO_CONTROLS, float("-inf")
        self.metrics, self._reported = metrics, 0  # the held count the metrics sink last heard

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
        self.unchecked += ready
        controls = await self.cached()
        self._note_groups(controls, ready)
        await self._check(controls, self.unchecked if len(self.unchecked) == len(ready) else self._unchecked_held())
        if controls.paused:
            log.info("%s: the queue is paused; holding %d jobs until it resumes", self.label, len(self.held))
            self.report()
            return []
        if self.blocked_until > time.monotonic():
            log.info("%s: the queue is rate limited; holding %d jobs", self.label, len(self.held))
            self.report()
            return []
        limited = controls.rate is not None or controls.concurrency is not None
        n = await self.grant(self.held) if limited else len(self.held)
        out, self.held = self.held[:n], self.held[n:]
        if self.held or self._reported:
            self.report()
        return out

    async def hold_first(self, reclaimed: list[Delivery]) -> None:
        """Entries reclaimed from a dead consumer while jobs are held: held ahead of them (they
        are older; one whose slot has not lapsed keeps it), checked before they are handed out."""
        if not reclaimed:
            return
        self.held[:0] = reclaimed
        self.unchecked += reclaimed
        self._note_groups(await self.cached(), reclaimed)
        self.report()

    def _note_groups(self, controls: Controls, ready: list[Delivery]) -> None:
        if controls.grouped:  # a grouped job may hold its group's slot, taken when it was moved
            for dl in ready:
                if dl.group:
                    self.grouped[dl.entry_id] = dl.group

    async def release_held(self, room: int) -> list[Delivery]:
        """Up to ``room`` held jobs, once the controls allow them (``PAUSE_POLL_SECS`` apart
        while paused or blocked, at the next rate window otherwise).  Transient errors raise."""
        wait = self._held_until - time.monotonic()
        if wait > 0:
            await (self._wait_for_slot(wait) if self._slot_bound else self._sleep(min(wait, PAUSE_POLL_SECS)))
            return []
        controls = await self.read()
        if self.unchecked:  # a batch held when Redis went away before its checks were read
            await self._check(controls, self._unchecked_held())
        if controls.cancels and self.held:  # cancelled while held (a paused queue, a full slot)
            await self._drop_cancelled(list(self.held))
        if controls.paused or self.blocked_until > time.monotonic():
            await self._sleep(PAUSE_POLL_SECS)
            return []
        n = min(room, len(self.held))
        if controls.rate is not None or controls.concurrency is not None:
            n = await self.grant(self.held[:n])
        out, self.held = self.held[:n], self.held[n:]
        self.report()
        return out

    async def cancelled_ids(self, job_ids: list[str]) -> set[str]:
        """Which of ``job_ids`` have a live cancel request (``core/running.py``).  A refused
        read (a hostile key type) is none: logged, never a stall."""
        try:
            reply = await self.driver.call(read_cancels_call(self.keys, job_ids))
        except TRANSIENT_ERRORS:
            raise
        except ChasquiError as exc:
            if self._take_log():
                log.warning("%s: the cancel requests cannot be read (%s); ignoring them", self.label, exc)
            return set()
        return parse_cancels(job_ids, reply, now_ms())

    def _unchecked_held(self) -> list[Delivery]:
        """The unchecked jobs still held (one released or lost since needs no check)."""
        held = set(map(id, self.held))
        return [dl for dl in self.unchecked if id(dl) in held]

    async def _check(self, controls: Controls, ready: list[Delivery]) -> None:
        """Read the cancels and own timeouts of ``ready``, the jobs held unchecked; they stay
        unchecked if a read fails (raised), and are checked again before they are handed out."""
        if controls.cancels:
            ready = await self._drop_cancelled(ready)
        if controls.timeouts:
            await self._read_timeouts(ready)
        self.unchecked = []

    async def _drop_cancelled(self, ready: list[Delivery]) -> list[Delivery]:
        """``ready`` without the jobs cancelled before they started (moved to :attr:`to_cancel`)."""
        hit = await self.cancelled_ids([dl.envelope.id for dl in ready])
        if not hit:
            return ready
        gone = [dl for dl in ready if dl.envelope.id in hit]
        self.to_cancel += gone
        self.held = [dl for dl in self.held if dl.envelope.id not in hit]
        return [dl for dl in ready if dl.envelope.id not in hit]

    async def _read_timeouts(self, ready: list[Delivery]) -> None:
        """Each job's own timeout (``core/running.py``), on a queue whose jobs may carry one.  A
        refused read (a hostile key type) leaves them without: logged, never a stall."""
        if not ready:  # every job of the batch was cancelled: nothing to read (MGET takes a key)
            return
        try:
            values = await self.driver.call(read_timeouts_call(self.keys, [dl.envelope.id for dl in ready]))
        except TRANSIENT_ERRORS:
            raise
        except ChasquiError as exc:
            if self._take_log():
                log.warning("%s: the jobs' own timeouts cannot be read (%s); ignoring them", self.label, exc)
            return
        for dl, raw in zip(ready, values if isinstance(values, list) else ()):
            ms = parse_timeout(raw)
            if ms:
                dl.timeout_ms = ms
                self.timed[dl.entry_id] = dl.envelope.id

    @property
    def prioritized(self) -> bool:
        """The queue uses priorities, as the controls said when last read."""
        return self._known.prioritized

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

    async def grant(self, candidates: list[Delivery]) -> int:
        """How many of ``candidates`` (a prefix) the concurrency and rate limits let start now;
        when not all, the held ones wait for a freed slot or the window the script named."""
        ids = [dl.entry_id for dl in candidates]
        try:
            reply = await self.driver.call(take_starts_call(self.keys, ids, self.lease_ms))
        except TRANSIENT_ERRORS:
            raise
        except ChasquiError as exc:  # a refused script: obey no limit rather than stall
            if self._take_log():
                log.warning("%s: the flow limits cannot be taken (%s); obeying none", self.label, exc)
            return len(ids)
        granted, wait_ms, slotted, server_ms = parse_take(reply, len(ids))
        if granted and log.isEnabledFor(logging.DEBUG):  # parsed by GRANT_LOGGED
            log.debug("%s: %d of %d starts granted at server time %d ms", self.label, granted, len(ids), server_ms)
        if slotted:
            self.slotted.update(ids[:granted])
        if granted < len(ids):
            self._slot_bound = not wait_ms
            self._held_until = time.monotonic() + (wait_ms / 1000 if wait_ms else SLOT_POLL_SECS)
        return granted

    # ---- concurrency slots --------------------------------------------------------------------
    def free(self, entry_ids: list[bytes]) -> list[Call]:
        """The calls that free the slots (the queue's, their groups') of these settling
        entries, sent with their settling writes."""
        calls = []
        if self.slotted:
            mine = [eid for eid in entry_ids if eid in self.slotted]
            if mine:
                self.slotted.difference_update(mine)
                calls.append(free_slots_call(self.keys, mine))
        if self.grouped:
            for group, ids in self._by_group(entry_ids, pop=True).items():
                calls.append(free_slots_call(self.keys, ids, self.keys.group_running(group)))
        return calls

    def _by_group(self, entry_ids: list[bytes], *, pop: bool) -> dict[str, list[bytes]]:
        out: dict[str, list[bytes]] = {}
        for eid in entry_ids:
            group = self.grouped.pop(eid, None) if pop else self.grouped.get(eid)
            if group is not None:
                out.setdefault(group.decode("utf-8"), []).append(eid)  # the gate kept UTF-8 names only
        return out

    def freed(self) -> None:
        """Slots were freed here: offer the jobs held for one again now."""
        if self._freed is not None:
            self._freed.set()
        self._held_until = 0.0 if self._slot_bound else self._held_until

    def forget(self, entry_id: bytes) -> None:
        """``entry_id`` left this worker unsettled (its lease lost, or left pending at a stop):
        its slot is not freed here; the worker that reclaims the entry keeps it, or it lapses
        one lease after its last renewal."""
        self.slotted.discard(entry_id)
        self.grouped.pop(entry_id, None)
        self.timed.pop(entry_id, None)  # its timeout key stays: the job runs again with it

    async def renew_slots(self, entry_ids: list[bytes]) -> None:
        """Renew the slots (the queue's, their groups') of these in-flight entries for one more
        lease, with their leases."""
        for call in self.slot_renewals(entry_ids):
            await self.driver.call(call)

    def slot_renewals(self, entry_ids: list[bytes]) -> list[Call]:
        """The calls of :meth:`renew_slots` (also sent by the lease guard's thread)."""
        mine = [eid for eid in entry_ids if eid in self.slotted]
        calls = [
            renew_slots_call(self.keys, mine[i : i + RENEW_CHUNK], self.lease_ms)
            for i in range(0, len(mine), RENEW_CHUNK)
        ]
        if self.grouped:
            for group, ids in self._by_group(entry_ids, pop=False).items():
                key = self.keys.group_running(group)
                calls += [
                    renew_slots_call(self.keys, ids[i : i + RENEW_CHUNK], self.lease_ms, key)
                    for i in range(0, len(ids), RENEW_CHUNK)
                ]
        return calls

    async def _wait_for_slot(self, wait: float) -> None:
        if self._freed is None:
            self._freed = asyncio.Event()
        self._freed.clear()
        try:
            await asyncio.wait_for(self._freed.wait(), min(wait, SLOT_POLL_SECS))
        except TimeoutError:
            raise_if_cancelling()

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
        self.report()

    def report(self) -> None:
        """Tell the metrics sink how many jobs this worker holds back (when it changed)."""
        if len(self.held) != self._reported:
            self._reported = len(self.held)
            self.metrics.jobs_held(self.keys.queue, self._reported)
