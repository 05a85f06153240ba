"""The intake's recovery (``engine/intake.py``): what a consumer owes before it reads anything
new -- its own pending entries left by an earlier run, entries held for redelivery that are
due, and the entries of a dead or frozen consumer once their lease lapsed (a pass every half
lease, coming back for entries as they lapse) -- and the ``stalled`` report of each job taken
over (chasquimq's stalled-job detector: an event, ``on_stalled``, the metric).  A mixin of
:class:`Intake`, which owns the state declared here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ..core.calls import int_reply, str_reply
from ..core.codec import now_ms
from ..core.consumer import ConsumerCore, Delivery, Rejected
from ..core.event_follow import after
from ._driver import AsyncDriver
from .metrics import WorkerMetrics

__all__ = ["IntakeRecovery", "Row"]

log = logging.getLogger("airflow_provider_chasqui.engine.intake")  # the intake's own records
Row = tuple[bytes, Any, int]  # entry id, stream fields, deliveries so far (this one included)
PENDING_ID, PENDING_IDLE, PENDING_COUNT = 0, 2, 3  # an XPENDING row: entry id, consumer, idle ms, deliveries
# a recovery pass coming back for entries that lapse before the next pass is due waits this much
# past their lapse (the server's idle clock and ours differ by the round trip), and at least this
RECOVERY_MARGIN_SECS, RECOVERY_MIN_GAP_SECS = 0.01, 0.01


class IntakeRecovery:
    """Owed entries, the recovery pass and stalled jobs, for :class:`~.intake.Intake`."""

    driver: AsyncDriver
    core: ConsumerCore
    label: str
    metrics: WorkerMetrics
    lease_ms: int
    hold_ms: int
    in_flight: set[bytes]
    redeliver: dict[bytes, tuple[float, int]]
    detect_stalls: bool
    on_stalled: Callable[[list[str]], None] | None
    _stalls: set[bytes]
    _own_after: str | None
    _next_recovery: float

    async def _owed(self, room: int) -> list[Row]:
        rows: list[Row] = []
        if self._own_after is not None:
            rows += await self._claim_own(room)
        if len(rows) < room and self.redeliver:
            now = time.monotonic()
            due = [eid for eid, (at, _) in self.redeliver.items() if at <= now][: room - len(rows)]
            rows += await self._claim(0, {eid: self.redeliver.pop(eid)[1] for eid in due})
        if len(rows) < room and time.monotonic() >= self._next_recovery:
            rows += await self._recover(room - len(rows))
        return rows

    async def _recover(self, want: int) -> list[Row]:
        """The recovery pass (every half lease): entries of a dead or stuck consumer, idle for
        a hold (``hold_ms``).  It also lists the entries idle for all but half a lease of the
        hold, which lapse before the next pass, and comes back for them as they lapse: a dead
        consumer's entries return a hold after its last renewal, not up to half a lease later.
        A live consumer's entries never show (renewed every tenth of a lease); the XCLAIM
        takes only what the server still finds idle for the hold, whenever the pass runs."""
        half = max(0.05, self.lease_ms / 2000)
        rows = await self.driver.call(self.core.idle_pending(max(0, self.hold_ms - int(half * 1000)), want))
        skip = self.holding()
        counts: dict[bytes, int] = {}
        soonest = half
        for row in rows or []:
            if row[PENDING_ID] in skip:
                continue
            idle_ms = int_reply(row[PENDING_IDLE])
            if idle_ms >= self.hold_ms:
                counts[row[PENDING_ID]] = int_reply(row[PENDING_COUNT])
            else:
                soonest = min(soonest, (self.hold_ms - idle_ms) / 1000 + RECOVERY_MARGIN_SECS)
        self._next_recovery = time.monotonic() + max(RECOVERY_MIN_GAP_SECS, soonest)
        idle = await self._claim(self.hold_ms, counts)
        if idle:
            log.info("%s reclaimed %d idle entries", self.label, len(idle))
            self._stalled_rows(idle)
        return idle

    def holding(self) -> Collection[bytes]:
        """Entries in flight or held for redelivery: a claim must not deliver them again."""
        return self.in_flight | self.redeliver.keys() if self.redeliver else self.in_flight

    async def _claim_own(self, want: int) -> list[Row]:
        """Our consumer's pending entries left by an earlier run (a crash, a restart), oldest
        first, each a new delivery; the backlog is done once a page comes back short."""
        assert self._own_after is not None
        rows = await self.driver.call(self.core.own_pending(self._own_after, want)) or []
        self._own_after = after(str_reply(rows[-1][0])) if len(rows) == want else None
        held = self.holding()
        counts = {row[PENDING_ID]: int_reply(row[PENDING_COUNT]) for row in rows if row[PENDING_ID] not in held}
        batch = await self._claim(0, counts)
        if batch:
            log.info("%s re-reads %d entries left pending by an earlier run", self.label, len(batch))
            self._stalled_rows(batch)
        return batch

    async def claim_idle(self, min_idle_ms: int, want: int, skip: Collection[bytes] = ()) -> list[Row]:
        """Entries pending for any consumer (a dead or stuck one) for ``min_idle_ms`` or longer."""
        rows = await self.driver.call(self.core.idle_pending(min_idle_ms, want))
        counts = {row[PENDING_ID]: int_reply(row[PENDING_COUNT]) for row in rows or [] if row[PENDING_ID] not in skip}
        return await self._claim(min_idle_ms, counts)

    async def _claim(self, min_idle_ms: int, counts: Mapping[bytes, int]) -> list[Row]:
        if not counts:
            return []
        claimed = await self.driver.call(self.core.claim(min_idle_ms, list(counts)))
        return [(eid, fields, counts.get(eid, 0) + 1) for eid, fields in claimed or [] if eid is not None]

    def _stalled_rows(self, rows: list[Row]) -> None:
        if self.detect_stalls:
            self._stalls.update(row[0] for row in rows)

    async def _report_stalls(self, stalls: set[bytes], ready: list[Delivery], rejected: list[Rejected]) -> None:
        """A ``stalled`` event (``e id ts [n] attempt``: the attempt that stalled) for each
        reclaimed job, before a dead-lettered one's ``dlq`` event; best effort, as every event."""
        jobs = [(dl.envelope.id, dl.name, dl.envelope.attempt + 1) for dl in ready if dl.entry_id in stalls]
        jobs += [(r.job_id, r.name, r.attempt + 1) for r in rejected if r.entry_id in stalls and r.job_id]
        if not jobs:
            return
        self.metrics.jobs_stalled(self.core.keys.queue, len(jobs))
        call = self.core.job_events("stalled", jobs, now_ms())
        if call is not None:
            try:
                await self.driver.call(call)
            except Exception as exc:  # noqa: BLE001 - events are best effort
                log.debug("%s: stalled events not written: %s", self.label, exc)
        if self.on_stalled is not None:
            self.on_stalled([job[0] for job in jobs])
