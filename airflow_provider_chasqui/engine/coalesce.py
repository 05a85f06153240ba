"""Concurrent plain adds on one ``Queue`` share round trips (issue 27).

A web app's handlers, a triggerer or a FastAPI service await ``Queue.add`` from many tasks at
once; one call each cost Redis a script or XADD and the client ~10 us of Python per job.  Here
an add that finds nothing gathering and a call free goes out alone at once (a lone caller still
pays one round trip, no timer); the adds made meanwhile gather and go as ``enqueue_batch`` calls
(at most ``MAX_BATCH`` each) a little later, two loop turns, no timer.

Up to ``IN_FLIGHT`` (2) calls are out at once, each carrying about half of the callers: while
Redis writes one half's jobs, the other half's callers, just answered, build their next adds.
With one call at a time the client and Redis took turns (the client idle while Redis wrote the
batch, Redis idle while the client built the next one).  After a call answers, the gathered adds
go once the answered callers have made their next adds (``AddCoalescer._flush_later``).

Each caller awaits its own job.  Validation happened in the caller (``ProducerCore.quick_parts``),
so what can fail a batch is the connection, and it fails that batch's callers only (each gets
the error).  A caller has one add in flight at a time, so its adds stay in order; calls share
the driver's pinned connection, where Redis runs them in the order they were sent.  A caller
cancelled while it waits is like a cancelled ``add`` whose command went out: the job may be added.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ..core.producer import ADD_BATCH as MAX_BATCH
from ..core.producer import ProducerCore

__all__ = ["AddCoalescer", "MAX_BATCH", "IN_FLIGHT"]

IN_FLIGHT = 2  # calls out at once: one half of the callers at Redis, the other adding


class AddCoalescer:
    def __init__(self, driver: Callable[[], Any], core: ProducerCore) -> None:
        self._driver, self._core = driver, core  # the queue's driver, asked at each call
        self._calls = 0  # calls out
        self._carried = 0  # adds those calls carry
        self._flush_soon = False
        self._waiting: list[tuple[bytes, bytes]] = []  # gathered adds: (envelope, name bytes) ...
        self._futures: list[asyncio.Future[None]] = []  # ... and their callers' futures, in step
        self._senders: set[asyncio.Task[None]] = set()  # references keep the batch tasks alive

    def add(self, envelope: bytes, name_bytes: bytes) -> Awaitable[None]:
        """What the caller awaits for its add: the future of the batch it joined, or (nothing
        gathering, a call free) its own call.  A plain function, so that a gathered add costs
        no coroutine of its own."""
        if self._calls < IN_FLIGHT and not self._waiting and not self._flush_soon:
            self._calls += 1
            self._carried += 1
            return self._alone(envelope, name_bytes)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((envelope, name_bytes))
        self._futures.append(fut)
        if self._calls < IN_FLIGHT:
            self._flush_later()
        return fut

    async def _alone(self, envelope: bytes, name_bytes: bytes) -> None:
        try:
            await self._driver().run_call(self._core.xadd_call(envelope, name_bytes))
        finally:
            self._answered(1)

    def _flush_later(self) -> None:
        """Flush two loop turns from now: the callers a call answered run in the next turn, and
        when both calls' replies arrive in one read their two halves are woken one after the
        other, the second half's callers a turn after the first call's flush was asked.  One turn
        sent the first half alone and split it again (calls of 25 and fewer under load)."""
        if not self._flush_soon:
            self._flush_soon = True
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self._flush)

    def _answered(self, n: int) -> None:
        """A call returned: its callers are about to add again.  The gathered adds go once they
        have (``_flush_later``), with theirs; a lone caller's next add goes straight out."""
        self._calls -= 1
        self._carried -= n
        if self._waiting or n > 1:
            self._flush_later()

    def _flush(self) -> None:
        """Send what gathered, in calls of about half the callers each (``IN_FLIGHT``)."""
        self._flush_soon = False
        while self._waiting and self._calls < IN_FLIGHT:
            callers = len(self._waiting) + self._carried
            size = min(MAX_BATCH, max(1, -(-callers // IN_FLIGHT)))
            rows, self._waiting = self._waiting[:size], self._waiting[size:]
            futures, self._futures = self._futures[:size], self._futures[size:]
            self._calls += 1
            self._carried += len(rows)
            sender = asyncio.ensure_future(self._send(rows, futures))
            self._senders.add(sender)
            sender.add_done_callback(self._senders.discard)

    async def _send(self, rows: list[tuple[bytes, bytes]], futures: list[asyncio.Future[None]]) -> None:
        try:
            if len(rows) == 1:
                await self._driver().run_call(self._core.xadd_call(*rows[0]))
            else:
                await self._driver().run_call(self._core.batch_call(rows))
        except BaseException as exc:
            for fut in futures:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        else:
            for fut in futures:
                if not fut.done():
                    fut.set_result(None)
        finally:
            self._answered(len(rows))
