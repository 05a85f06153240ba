"""One consumer of a queue's group: the Redis side of reading, claiming, leasing and settling.

The :class:`~airflow_provider_chasqui.engine.worker.Worker` and the Airflow queue-events
trigger (``triggers/queue_events.py``) are both consumers of a queue's group; they differ in
what happens between reading an entry and settling it (a handler, or an asset event saved by
Airflow), not in how entries are read, reclaimed from dead consumers, kept leased or
acknowledged.  Those steps live here, once, on top of :class:`ConsumerCore` (the sans-I/O
commands and decisions) and an :class:`AsyncDriver`.  A row is ``(entry_id, fields,
delivery_count)``; ``skip`` sets name entries the caller already holds, which a claim must not
deliver a second time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from ..core.calls import Call, int_reply, str_reply
from ..core.consumer import CompleteRow, ConsumerCore, FailRow
from ..core.features import Features
from ..errors import BusyGroupError
from ._driver import AsyncDriver

Row = tuple[bytes, Any, int]  # entry id, stream fields, deliveries so far (this one included)
RENEW_CHUNK = 1000  # entries per renew_lease call


class GroupConsumer:
    """The consumer ``core.consumer_id`` of group ``core.group`` on ``core.keys.stream``."""

    def __init__(self, driver: AsyncDriver, core: ConsumerCore) -> None:
        self.driver = driver
        self.core = core

    async def ensure_group(self) -> None:
        """Create the group (and the stream) unless it exists."""
        try:
            await self.driver.call(self.core.create_group())
        except BusyGroupError:  # it exists
            pass

    async def read_new(self, want: int, block_ms: int | None) -> list[Row]:
        """Entries never delivered before; ``block_ms`` None reads without waiting."""
        reply = await self.driver.call(self.core.read(want, block_ms))
        return [(eid, fields, 1) for _stream, entries in reply or [] for eid, fields in entries]

    async def claim_idle(self, min_idle_ms: int, want: int, skip: Collection[bytes] = ()) -> list[Row]:
        """Entries pending for any consumer (a dead or stuck one) for ``min_idle_ms`` or longer."""
        rows = await self.driver.call(self.core.idle_pending(min_idle_ms, want))
        counts = {row[0]: int_reply(row[3]) for row in rows or [] if row[0] not in skip}
        if not counts:
            return []
        return await self._claim(min_idle_ms, counts)

    async def claim_own(self, after: str, want: int, skip: Collection[bytes] = ()) -> tuple[list[Row], str | None]:
        """This consumer's own pending entries after ``after`` (left by an earlier run of the
        same consumer name), claimed again as new deliveries.  Returns the rows and the cursor
        to continue from, or None once the pending list is exhausted."""
        rows = await self.driver.call(self.core.own_pending(after, want)) or []
        cursor = "(" + str_reply(rows[-1][0]) if len(rows) == want else None
        counts = {row[0]: int_reply(row[3]) for row in rows if row[0] not in skip}
        return (await self._claim(0, counts) if counts else []), cursor

    async def claim_again(self, counts: Mapping[bytes, int]) -> list[Row]:
        """Redeliver entries this consumer holds (deliveries so far given per entry)."""
        return await self._claim(0, counts) if counts else []

    async def _claim(self, min_idle_ms: int, counts: Mapping[bytes, int]) -> list[Row]:
        claimed = await self.driver.call(self.core.claim(min_idle_ms, list(counts)))
        return [(eid, fields, counts.get(eid, 0) + 1) for eid, fields in claimed or [] if eid is not None]

    async def renew(self, entry_ids: list[bytes]) -> dict[bytes, bytes]:
        """Renew the lease on ``entry_ids`` (idle time reset); returns the entries this
        consumer no longer owns, each with its new owner (``b""``: settled, no longer pending)."""
        lost: list[Any] = []
        for i in range(0, len(entry_ids), RENEW_CHUNK):
            lost += await self.driver.call(self.core.renew_lease(entry_ids[i : i + RENEW_CHUNK])) or []
        return {lost[i]: lost[i + 1] for i in range(0, len(lost) - 1, 2)}

    async def reap(self, min_idle_ms: int, name: str = "") -> list[Any]:
        """Remove consumers (or only ``name``) with nothing pending, idle ``min_idle_ms``."""
        return list(await self.driver.call(self.core.reap_consumers(min_idle_ms, name)) or [])

    async def complete(self, rows: list[CompleteRow], features: Features, now: int) -> None:
        """Acknowledge and delete finished entries (``complete_batch``, ``completed`` events)."""
        await self.driver.call(self.core.complete(rows, features, now))

    async def fail(self, rows: list[FailRow], features: Features, now: int) -> None:
        """Retry or dead-letter failed entries (``fail_batch``)."""
        await self.driver.call(self.core.fail(rows, features, now))

    async def settle(self, done: list[CompleteRow], dead: list[Call], features: Features, now: int) -> None:
        """Settle a batch in one round trip: the finished entries (one ``complete_batch``),
        then the dead letters.  Every call is idempotent (an entry no longer pending is neither
        acknowledged nor dead-lettered twice), so the caller may retry after a lost reply."""
        calls = ([self.core.complete(done, features, now)] if done else []) + dead
        if calls:
            await self.driver.pipeline(calls)
