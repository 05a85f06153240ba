"""The intake's settling writes (``engine/intake.py``): finished entries (``complete_batch``),
failed or refused ones (``fail_batch``) and cancelled ones (``cancel_jobs``) in one round trip
each, retried through outages; the entries of lost leases are dropped unwritten, and whatever
happens the entries leave the flight (one that was not written stays pending and is reclaimed
after the lease).  A mixin of :class:`Intake`, which owns the state declared here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from ..core.calls import Call, command, str_reply
from ..core.codec import encode_member, now_ms
from ..core.consumer import CompleteRow, ConsumerCore, Delivery, FailRow
from ..core.features import Features
from ..core.groups import requeue_grouped_calls
from ..core.history import MinuteCounts
from ..core.pacing import Backoff
from ..core.rows import COMPLETE_ENTRY_ID, FAIL_ENTRY_ID
from ..core.running import cancel_jobs_call, settled_timeout_calls
from ..errors import TRANSIENT_ERRORS
from ._driver import AsyncDriver
from .cancellation import raise_if_cancelling
from .flow_gate import FlowGate

__all__ = ["IntakeSettling"]

log = logging.getLogger("airflow_provider_chasqui.engine.intake")  # the intake's own records


class IntakeSettling:
    """Writing outcomes, for :class:`~.intake.Intake`."""

    driver: AsyncDriver
    core: ConsumerCore
    flow: FlowGate
    features: Features
    label: str
    history: MinuteCounts
    in_flight: set[bytes]
    settling: set[bytes]
    lost: dict[bytes, bytes]
    write_tries: int | None
    stopping: asyncio.Event

    def owned(self, rows: list[Any], at: int) -> list[Any]:
        """The rows (entry id at index ``at``: ``COMPLETE_ENTRY_ID`` or ``FAIL_ENTRY_ID``) whose
        entry this consumer still owns; the lost
        ones are released unwritten, each logged."""
        if not self.lost:
            return rows
        keep = []
        for row in rows:
            owner = self.lost.pop(row[at], None)
            if owner is None:
                keep.append(row)
                continue
            log.warning(
                "%s: entry %s finished after its lease was lost to %r: outcome not recorded",
                self.label,
                str_reply(row[at]),
                owner or "nobody (done)",
            )
            self.in_flight.discard(row[at])
            self.flow.forget(row[at])
        return keep

    async def settle(self, done: Sequence[CompleteRow] = (), failed: Sequence[FailRow] = ()) -> None:
        """Write finished entries (one ``complete_batch``) and failed or refused ones (one
        ``fail_batch``) in one round trip, retried through outages; the rows must come from
        :meth:`owned`.  Every call is idempotent (an entry no longer pending is neither acked
        nor dead-lettered twice).  The entries leave :attr:`in_flight` whether or not the write
        succeeded: one that failed for good stays pending and is reclaimed after the lease."""
        now = now_ms()
        calls = []
        if done:
            calls.append(self.core.complete(done if isinstance(done, list) else list(done), self.features, now))
        if failed:
            calls.append(self.core.fail(failed if isinstance(failed, list) else list(failed), self.features, now))
        if self.flow.timed:  # jobs with their own timeout: keep it for a retry, else remove it
            calls += settled_timeout_calls(self.core.keys, self.flow.timed, list(done), list(failed), now)
        ids = [row[COMPLETE_ENTRY_ID] for row in done]
        ids += [row[FAIL_ENTRY_ID] for row in failed]
        free = None  # a queue without a concurrency limit or groups holds no slots: nothing to build
        if self.flow.slotted or self.flow.grouped:
            free = self.flow.free(ids)
            calls += free
        self.settling.update(ids)
        try:
            await self._write(calls)
            if free:
                self.flow.freed()
            self.history.add(now, len(done), len(failed))
        finally:
            self._settled(ids)

    def _settled(self, ids: list[bytes]) -> None:
        """These entries leave the flight, written or not (see :meth:`settle`)."""
        self.in_flight.difference_update(ids)
        self.settling.difference_update(ids)
        if self.lost:
            for eid in ids:
                self.lost.pop(eid, None)

    async def _settle_to_cancel(self) -> None:
        """End the jobs the gate found cancelled before they started."""
        if self.flow.to_cancel:
            gone, self.flow.to_cancel = self.flow.to_cancel, []
            await self.settle_cancelled(gone)

    async def settle_cancelled(self, cancelled: list[Delivery]) -> None:
        """End these entries' jobs cancelled (``lua/cancel_jobs.lua``: acked, never retried nor
        dead-lettered), freeing what they held; like :meth:`settle`, they leave the flight
        whatever happens (an unwritten one is reclaimed after the lease, and cancelled then)."""
        ids = [dl.entry_id for dl in cancelled]
        k = self.core.keys
        rows = [(dl.entry_id, dl.envelope.id, dl.name) for dl in cancelled]
        calls = [
            cancel_jobs_call(
                k, rows, group=self.core.group, xackdel=self.features.xackdel, events_max=self.core.events_max
            )
        ]
        if self.flow.timed:
            calls += settled_timeout_calls(k, self.flow.timed, [(eid,) for eid in ids], [], now_ms())
        if self.flow.slotted or self.flow.grouped:
            calls += self.flow.free(ids)
        self.settling.update(ids)
        try:
            await self._write(calls)
            self.flow.freed()
        finally:
            self._settled(ids)

    async def _write(self, calls: list[Call]) -> None:
        """Run ``calls`` (one pipeline), retrying transient errors: ``write_tries`` times, or
        until ``stopping`` and three more failures."""
        if not calls:
            return
        backoff = Backoff()
        while True:
            try:
                await (self.driver.call(calls[0]) if len(calls) == 1 else self.driver.pipeline(calls))
                return
            except TRANSIENT_ERRORS as exc:
                raise_if_cancelling()
                failures = backoff.failures + 1
                if (self.write_tries is not None and failures >= self.write_tries) or (
                    self.stopping.is_set() and failures > 3
                ):
                    raise
                delay = backoff.next()
                log.warning("%s: writing failed (%s); retry in %.2fs", self.label, exc, delay)
                await asyncio.sleep(delay)

    async def requeue_grouped(self, dl: Delivery, block_ms: int) -> None:
        """A grouped job whose handler raised ``RateLimited``: back at the head of its group's
        list (no attempt counted) and its group blocked for ``block_ms``, the other groups
        going on; its stream entry is acked and deleted after that, in the same round trip
        (a failure in between runs it twice, never loses it)."""
        k, eid = self.core.keys, dl.entry_id
        group = dl.group.decode("utf-8")  # the gate kept UTF-8 group names only
        member = encode_member(dl.raw_name or dl.name.encode("utf-8"), dl.raw)
        calls = requeue_grouped_calls(k, group, member, max(1, block_ms))
        calls += [command("XACK", k.stream, self.core.group, eid), command("XDEL", k.stream, eid)]
        calls += self.flow.free([eid])
        self.settling.add(eid)
        try:
            await self._write(calls)
        finally:
            self._settled([eid])
        self.flow.freed()
