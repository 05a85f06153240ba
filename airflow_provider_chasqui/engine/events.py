"""``QueueEvents``: follow ``{chasqui:<q>}:events`` with plain XREAD (no consumer group).

Its position, pinned start and reads are every follower's (``core/event_follow.py``
``EventCursor``), so the followers of the stream cannot drift apart.

Compatible with chasquimq's ``QueueEvents``: ``async for ev in QueueEvents(q)`` (the cursor
is kept in the object, starting at ``$``, only new events, unless told otherwise), and its
listeners: ``on("completed", callback)`` or ``on("completed:<job id>", ...)`` for one job, each
callback given ``(payload, event_id)`` (:func:`event_payload`), read by a task of its own with
its own cursor (``engine/listeners.py`` says how callbacks run).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from ..core.calls import reply_pairs, str_reply
from ..core.event_follow import EventCursor
from ..core.keys import QueueKeys
from ..core.settings import MAX_MS, check_int
from ..core.urls import check_url, read_timeout
from ..credentials import register as register_credentials
from ..types import QueueEvent
from ._driver import AsyncDriver
from .leader import TRANSIENT
from .listeners import Listeners

__all__ = ["QueueEvents", "parse_event", "event_payload"]

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


NUMERIC_FIELDS = frozenset(("attempt", "backoff_ms", "delay_ms", "duration_us"))
CLOSE_GRACE_SECS = 0.5  # how long close() lets a cancelled reader end before cancelling it again


def event_payload(ev: QueueEvent) -> dict[str, Any]:
    """What a listener gets (chasquimq's shape): ``jobId``, ``name`` (the job's name), ``ts``,
    then the event's own fields, the numeric ones as ints and ``progress`` decoded from its JSON."""
    payload: dict[str, Any] = {"jobId": ev.job_id, "name": ev.job_name, "ts": ev.ts_ms}
    for key, value in ev.fields.items():
        if key in NUMERIC_FIELDS and value.isdigit():
            payload[key] = int(value)
        elif key == "progress":
            try:
                payload[key] = json.loads(value)
            except ValueError:
                payload[key] = value
        else:
            payload[key] = value
    return payload


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
        credential_provider: Any = None,
    ) -> None:
        self.keys = QueueKeys.for_queue(queue_name)
        check_int("block_ms", block_ms, 1, MAX_MS)  # None would be a loop of reads that return at once
        self.cursor = EventCursor(self.keys, last_event_id, count=count, block_ms=block_ms)
        register_credentials(check_url(redis_url), credential_provider)  # credentials.py
        self._driver = driver or AsyncDriver(check_url(redis_url), socket_timeout=read_timeout(block_ms))
        self._closed = False
        self._start = last_event_id  # where the listeners' own cursor starts
        self._listeners = Listeners(f"events of {self.keys.queue}")
        self._dispatcher: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None

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

    def __aiter__(self) -> AsyncIterator[QueueEvent]:
        return self._follow(self.cursor)

    async def _follow(self, cursor: EventCursor) -> AsyncIterator[QueueEvent]:
        if not cursor.pinned:  # pin "$" to a concrete id so no event slips between reads
            cursor.pin(await self._driver.call(cursor.pin_call()))
        if cursor is not self.cursor and self._ready is not None:
            self._ready.set()
        while not self._closed:
            try:
                rows = await self._driver.call(cursor.read_call())
                if not rows and cursor.stuck:  # at the largest id: read on once the stream moved on
                    cursor.unstick(await self._driver.call(cursor.end_call()))
            except TRANSIENT as exc:
                log.warning("events of %s: Redis unavailable (%s); retrying", self.name, exc)
                await asyncio.sleep(0.5)
                continue
            for entry_id, flat in cursor.consume(rows):
                yield parse_event(entry_id, flat)

    # ---- listeners ------------------------------------------------------------------------
    def on(self, event: str, callback: Callable[..., Any]) -> Callable[..., Any]:
        """Call ``callback(payload, event_id)`` for each ``event`` (``"completed"``), or for
        one job's (``"completed:<job id>"``); an ``async def`` callback runs as a task.  The
        listeners' reader starts with the first listener (within a running loop)."""
        self._listeners.on(event, callback)
        self._start_dispatch()
        return callback

    def once(self, event: str, callback: Callable[..., Any]) -> Callable[..., Any]:
        self._listeners.once(event, callback)
        self._start_dispatch()
        return callback

    def off(self, event: str, callback: Callable[..., Any] | None = None) -> None:
        self._listeners.off(event, callback)

    async def wait_until_ready(self, timeout: float = 30.0) -> None:
        """Returns once the listeners' reader has fixed its start: every event written after
        this returns reaches the listeners.  ``TimeoutError`` if Redis does not answer."""
        self._start_dispatch()
        assert self._ready is not None
        await asyncio.wait_for(self._ready.wait(), timeout)

    def _start_dispatch(self) -> None:
        if self._dispatcher is not None or self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop yet: wait_until_ready() starts it
        self._listeners.bind(loop)
        self._ready = asyncio.Event()
        self._dispatcher = loop.create_task(self._dispatch(), name=f"chasqui-events-{self.name}")

    async def _dispatch(self) -> None:
        cursor = EventCursor(self.keys, self._start, count=self.cursor.count, block_ms=self.cursor.block_ms)
        emit = self._listeners.emit
        while not self._closed:
            try:
                async for ev in self._follow(cursor):
                    if not self._listeners:
                        continue
                    payload = event_payload(ev)
                    emit(ev.name, payload, ev.event_id)
                    if ev.job_id:
                        emit(f"{ev.name}:{ev.job_id}", payload, ev.event_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("events of %s: the listeners' reader failed; restarting", self.name)
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        """Stop the listeners' reader and close the connections.  A cancel can be lost as a
        blocking read goes out (redis-py sends through ``asyncio.wait_for``, which loses one on
        Python 3.11): that read would run its whole ``block_ms``, so a reader still running
        after ``CLOSE_GRACE_SECS`` is cancelled again (a blocked read ends at a cancel)."""
        self._closed = True
        dispatcher = self._dispatcher
        if dispatcher is not None:
            while not dispatcher.done():
                dispatcher.cancel()
                await asyncio.wait([dispatcher], timeout=CLOSE_GRACE_SECS)
            await asyncio.gather(dispatcher, return_exceptions=True)
        await self._listeners.settle()
        await self._driver.close()
