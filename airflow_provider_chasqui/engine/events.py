"""``QueueEvents``: follow ``{chasqui:<q>}:events`` with plain XREAD (no consumer group).

Its position, pinned start and reads are every follower's (``core/event_follow.py``
``EventCursor``), so the followers of the stream cannot drift apart.

Compatible with chasquimq's ``QueueEvents`` (``async for ev in QueueEvents(q)``); the cursor
is kept in the object, starting at ``$`` (only new events) unless told otherwise.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from ..core.calls import reply_pairs, str_reply
from ..core.event_follow import EventCursor
from ..core.keys import QueueKeys
from ..core.settings import MAX_MS, check_int
from ..core.urls import check_url, read_timeout
from ..types import QueueEvent
from ._driver import AsyncDriver
from .leader import TRANSIENT

__all__ = ["QueueEvents", "parse_event"]

log = logging.getLogger(__name__)


def parse_event(entry_id: Any, flat: list[Any]) -> QueueEvent:
    f = {key: str_reply(value) for key, value in reply_pairs(flat).items()}
    name = f.pop("e", "")
    job_id = f.pop("id", "")
    ts = f.pop("ts", "0")
    job_name = f.pop("n", "")
    return QueueEvent(
        name=name,
        job_id=job_id or None,
        job_name=job_name,
        fields=f,
        ts_ms=int(ts) if ts.isdigit() else 0,
        event_id=str_reply(entry_id),
    )


class QueueEvents:
    """Async iterator over a queue's events.  One consumer task per instance."""

    def __init__(
        self,
        queue_name: str,
        *,
        redis_url: str = "redis://127.0.0.1:6379",
        last_event_id: str = "$",
        block_ms: int = 5000,
        count: int = 100,
        driver: AsyncDriver | None = None,
    ) -> None:
        self.keys = QueueKeys.for_queue(queue_name)
        check_int("block_ms", block_ms, 1, MAX_MS)  # None would be a loop of reads that return at once
        self.cursor = EventCursor(self.keys, last_event_id, count=count, block_ms=block_ms)
        self._driver = driver or AsyncDriver(check_url(redis_url), socket_timeout=read_timeout(block_ms))
        self._closed = False

    @property
    def name(self) -> str:
        return self.keys.queue

    @property
    def last_event_id(self) -> str:
        """The id of the last event handed out (``"$"`` until the start is pinned)."""
        return self.cursor.position

    @last_event_id.setter
    def last_event_id(self, value: str) -> None:
        self.cursor.seek(value)

    @property
    def block_ms(self) -> int | None:
        return self.cursor.block_ms

    @block_ms.setter
    def block_ms(self, value: int | None) -> None:
        self.cursor.block_ms = value

    @property
    def count(self) -> int:
        return self.cursor.count

    @count.setter
    def count(self, value: int) -> None:
        self.cursor.count = value

    async def _resolve_start(self) -> None:
        if not self.cursor.pinned:  # pin "$" to a concrete id so no event slips between reads
            self.cursor.pin(await self._driver.call(self.cursor.pin_call()))

    def __aiter__(self) -> AsyncIterator[QueueEvent]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[QueueEvent]:
        await self._resolve_start()
        while not self._closed:
            try:
                rows = await self._driver.call(self.cursor.read_call())
                if not rows and self.cursor.stuck:  # at the largest id: read on once the stream moved on
                    self.cursor.unstick(await self._driver.call(self.cursor.end_call()))
            except TRANSIENT as exc:
                log.warning("events of %s: Redis unavailable (%s); retrying", self.name, exc)
                await asyncio.sleep(0.5)
                continue
            for entry_id, flat in self.cursor.consume(rows):
                yield parse_event(entry_id, flat)

    async def close(self) -> None:
        self._closed = True
        await self._driver.close()
