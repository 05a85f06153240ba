"""The intake's leases (``engine/intake.py``): every entry handed out stays this consumer's while
it is renewed ``RENEWALS_PER_LEASE`` times per lease, with the heartbeat and history counts
beside the renewals; an entry another consumer took over meanwhile is *lost* (``on_lost`` hears
of it, and its outcome is never written), and a job whose last renewal is late is renewed
before it starts (:meth:`IntakeLeases.lease_held`).  A mixin of :class:`Intake`, which owns
the state declared here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from ..core.calls import Call
from ..core.codec import now_ms
from ..core.consumer import ConsumerCore
from ..core.history import MinuteCounts
from ..core.key_types import replace_spoiled, written_types
from ..core.liveness import beat_calls
from ..core.pacing import LogBudget
from ..errors import TRANSIENT_ERRORS, WrongTypeError
from ._driver import AsyncDriver
from .cancellation import raise_if_cancelling
from .flow_gate import FlowGate
from .metrics import WorkerMetrics

__all__ = ["IntakeLeases", "RENEWALS_PER_LEASE", "START_CHECK_FRACTION", "lost_pairs"]

log = logging.getLogger("airflow_provider_chasqui.engine.intake")  # the intake's own records

RENEW_CHUNK = 1000  # entries per renew_lease call
# The lease is renewed this many times per term, and another consumer takes an entry over only
# once it was idle for a lease plus one renewal interval (``Intake.hold_ms``): a consumer's last
# renewal began at most one interval before it stopped, so a pause (or a blocked loop: see
# engine/lease_guard.py) shorter than the whole lease never loses a held entry
# (tests/faults/test_lease_pause.py, tests/faults/test_lease_whole.py).
RENEWALS_PER_LEASE = 10
# lease_held() renews before a job starts when the last renewal began longer ago than this share
# of the lease (two renewals missed: a paused process, a blocked loop).
START_CHECK_FRACTION = 0.2


def lost_pairs(reply: list[Any]) -> dict[bytes, bytes]:
    """``renew_lease``'s replies, concatenated: entry id -> its new owner (``b""``: not pending)."""
    return {reply[i]: reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def _retrieved(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


class IntakeLeases:
    """Lease renewal, the heartbeat and lost entries, for :class:`~.intake.Intake`."""

    driver: AsyncDriver
    core: ConsumerCore
    flow: FlowGate
    lease_ms: int
    label: str
    metrics: WorkerMetrics
    identity: dict[str, Any] | None
    healthy: Callable[[], bool]
    beat_log: LogBudget  # refused beats and slot renewals: one warning a minute
    left_running: Callable[[], int]
    history: MinuteCounts
    in_flight: set[bytes]
    settling: set[bytes]
    lost: dict[bytes, bytes]
    renewed_at: float
    on_lost: Callable[[dict[bytes, bytes]], None] | None
    _renewal: asyncio.Future[None] | None

    async def run_leases(self) -> None:
        """Renew every in-flight entry ``RENEWALS_PER_LEASE`` times per lease, until cancelled."""
        interval = self.lease_ms / 1000 / RENEWALS_PER_LEASE
        if self.identity is not None:  # listed at once, not one renewal period later
            await self.beat(self.beat_calls())
        while True:
            await asyncio.sleep(max(0.0, self.renewed_at + interval - time.monotonic()))
            try:
                await self.renew()
            except TRANSIENT_ERRORS as exc:
                raise_if_cancelling()
                log.warning("%s: lease renewal failed (%s); retrying", self.label, exc)
                await asyncio.sleep(min(interval, 1.0))
                continue
            beat = self.beat_calls() + self.history.take_calls(self.core.keys)
            if beat:
                await self.beat(beat)

    async def beat(self, calls: list[Call]) -> None:
        """:meth:`send_beat`, whose failure never stops the renewals.  Redis out of memory
        (``maxmemory``, no eviction) refuses the beat's ``SET`` but not the renewal's ``XCLAIM``:
        the refused beat crashed the lease task before its next renewal, again at each restart,
        and another worker took over the running jobs and ran them a second time.  Logged at
        most once a minute; the next beat tries again."""
        try:
            await self.send_beat(calls)
        except Exception as exc:  # noqa: BLE001 - see the docstring; cancellation is not an Exception
            self.not_renewed("heartbeat", exc)

    def not_renewed(self, what: str, exc: BaseException) -> None:
        """A heartbeat or slot renewal Redis refused (or lost) beside leases that held: one
        warning a minute (``beat_log``), from the loop or the lease guard's thread."""
        if self.beat_log.take()[0]:
            log.warning("%s: %s not renewed (%s); the leases are renewed regardless", self.label, what, exc)

    async def send_beat(self, calls: list[Call]) -> None:
        """The heartbeat and history counts.  A beats or history key of another type (hostile or
        foreign) is replaced and the beat goes on; it used to stop the lease renewals in a loop."""
        try:
            await self.driver.pipeline(calls)
        except WrongTypeError as exc:
            replaced = await self.driver.run(replace_spoiled(written_types(calls)))
            log.warning("%s: %s: replaced %s (the counts of that beat are lost)", self.label, exc, sorted(replaced))

    async def renew(self) -> None:
        """One ``renew_lease`` call (per 1,000 entries) for all in-flight entries; entries
        another consumer took over are marked lost."""
        started = time.monotonic()
        ids = [eid for eid in self.in_flight if eid not in self.lost] if self.lost else list(self.in_flight)
        lost = await self.renew_ids(ids)
        if self.flow.slotted or self.flow.grouped:
            try:
                await self.flow.renew_slots([eid for eid in ids if eid not in lost])
            except TRANSIENT_ERRORS:
                raise
            except Exception as exc:  # noqa: BLE001 - refused (out of memory): the leases above hold regardless
                self.not_renewed("concurrency slots", exc)
        self.renewed_at = max(self.renewed_at, started)
        if ids:
            self.metrics.lease_renewed(self.core.keys.queue, len(ids) - len(lost))
        self.lost_found(lost)

    def lost_found(self, lost: dict[bytes, bytes]) -> None:
        """Entries a renewal found taken over (by this loop's renewal or the lease guard's)."""
        lost = {
            eid: owner
            for eid, owner in lost.items()
            if eid in self.in_flight and eid not in self.lost and not (owner == b"" and eid in self.settling)
        }  # (an entry this consumer is settling right now is no longer pending: not lost, ours)
        if lost:
            self.metrics.lease_lost(self.core.keys.queue, len(lost))
            self.lost.update(lost)
            if self.flow.held:  # held back by the gate, never handed out: released here, never run
                gone = [dl.entry_id for dl in self.flow.held if dl.entry_id in lost]
                if gone:
                    self.flow.held = [dl for dl in self.flow.held if dl.entry_id not in lost]
                    for eid in gone:
                        self.release(eid)
                    self.flow.report()
            if self.on_lost is not None:
                self.on_lost(lost)

    async def renew_ids(self, entry_ids: list[bytes]) -> dict[bytes, bytes]:
        """Renew the lease on ``entry_ids``; returns those this consumer no longer owns, each
        with its new owner (``b""``: settled, no longer pending)."""
        lost: list[Any] = []
        for call in self.lease_renewals(entry_ids):
            lost += await self.driver.call(call) or []
        return lost_pairs(lost)

    def beat_calls(self) -> list[Call]:
        """This consumer's heartbeat (``core/liveness.py``), sent with the lease renewals."""
        if self.identity is None:
            return []
        keys, name = self.core.keys, self.core.consumer_id
        return beat_calls(keys, name, self.identity, self.lease_ms, now_ms(), self.healthy(), self.left_running())

    def lease_renewals(self, entry_ids: list[bytes]) -> list[Call]:
        """The ``renew_lease`` calls of :meth:`renew_ids` (also sent by the lease guard's thread)."""
        return [self.core.renew_lease(entry_ids[i : i + RENEW_CHUNK]) for i in range(0, len(entry_ids), RENEW_CHUNK)]

    async def lease_held(self, entry_id: bytes, job_id: str) -> bool:
        """Whether ``entry_id`` may start, asked when the last renewal is late (the process was
        paused or its loop blocked, maybe past the whole lease while another consumer ran the
        job): renew now (one renewal shared by every asker) and say yes only if this consumer
        still owns the entry.  If Redis cannot be reached the answer is no: the entry stays
        pending and is reclaimed after the lease.  A "no" releases the entry."""
        try:
            renewal = self._renewal
            if renewal is None or renewal.done():  # after a pause every slot asks at once: one call
                renewal = self._renewal = asyncio.ensure_future(self.renew())
                renewal.add_done_callback(_retrieved)  # its error is logged below, even if every asker left
            await asyncio.shield(renewal)
        except Exception as exc:  # noqa: BLE001 - unknown ownership: do not start, the entry stays pending
            log.warning(
                "%s: lease of job %s unknown (%s): not started, it is reclaimed after the lease",
                self.label,
                job_id,
                exc,
            )
            self.release(entry_id)
            return False
        if entry_id in self.lost:  # on_lost dropped the queued ones; this one was already taken
            owner = self.lost.pop(entry_id)
            log.warning(
                "%s: job %s not started: its lease was lost to %r", self.label, job_id, owner or "nobody (done)"
            )
            self.release(entry_id)
            return False
        return True

    async def check_lease(self) -> None:
        """Before settling: if no renewal began within half a lease (a pause, an outage), renew
        first, so an entry taken over meanwhile is known lost."""
        if self.in_flight and time.monotonic() - self.renewed_at > self.lease_ms / 2000:
            try:
                await self.renew()
            except Exception as exc:  # noqa: BLE001 - the writes' own retries handle an outage
                log.warning("%s: lease check before settling failed: %s", self.label, exc)

    def release(self, entry_id: bytes) -> None:
        """Stop holding ``entry_id`` without settling it: it stays pending, unrenewed, and is
        reclaimed after the lease (by this consumer or another)."""
        self.in_flight.discard(entry_id)
        self.lost.pop(entry_id, None)
        self.flow.forget(entry_id)
