"""Concurrent plain adds on one ``Queue`` share round trips (issue 27).

A web app's handlers, a triggerer or a FastAPI service await ``Queue.add`` from many tasks at
once; one call each cost Redis a script or XADD and the client ~10 us of Python per job.  Here
the first add goes out alone at once (a lone caller still pays one round trip, no timer), and the
adds made while a call is in flight wait together; when it returns they go as one
``enqueue_batch`` call (at most ``MAX_BATCH``), while the next ones gather.  After a call that
answered several callers they wait one loop turn more, so the next adds of those callers join
them (sent at once, the add made during a call went alone and every other call carried one).
Each caller awaits its own job; validation happened in the caller (``ProducerCore.quick_parts``),
so what can fail a batch is the connection, and it fails the callers of that batch (each gets
the error).  A caller cancelled while it waits is like a cancelled ``add`` whose command went
out: the job may be added.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from ..core.producer import ADD_BATCH as MAX_BATCH
from ..core.producer import ProducerCore

__all__ = ["AddCoalescer", "MAX_BATCH"]


class AddCoalescer:
    def __init__(self, driver: Callable[[], Any], core: ProducerCore) -> None:
        self._driver, self._core = driver, core  # the queue's driver, asked at each call
        self._busy = False
        self._waiting: list[tuple[bytes, bytes, asyncio.Future[None]]] = []
        self._sender: asyncio.Task[None] | None = None  # a reference keeps the batch task alive

    async def add(self, envelope: bytes, name_bytes: bytes) -> None:
        if self._busy:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append((envelope, name_bytes, fut))
            await fut
            return
        self._busy = True
        try:
            await self._driver().run_call(self._core.xadd_call(envelope, name_bytes))
        finally:
            self._next()

    def _next(self, answered: int = 1) -> None:
        """Send what gathered meanwhile; with nothing gathered, look once more after the callers
        just answered have run (one loop turn, no timer): the adds they make next go together
        instead of one of them going alone.  After a call that answered several callers, wait
        that turn even if some adds gathered: they go with the answered callers' next adds
        (otherwise the one add made during a call goes alone, and every other call carries one)."""
        if answered > 1:
            asyncio.get_running_loop().call_soon(self._next)
            return
        if self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            self._sender = asyncio.ensure_future(self._send(batch))
        elif self._sender is not None:
            self._sender = None
            asyncio.get_running_loop().call_soon(self._next)
        else:
            self._busy = False

    async def _send(self, batch: list[tuple[bytes, bytes, asyncio.Future[None]]]) -> None:
        try:
            if len(batch) == 1:
                await self._driver().run_call(self._core.xadd_call(batch[0][0], batch[0][1]))
            else:
                await self._driver().run_call(self._core.batch_call([(e, n) for e, n, _ in batch]))
        except BaseException as exc:
            for _e, _n, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        else:
            for _e, _n, fut in batch:
                if not fut.done():
                    fut.set_result(None)
        finally:
            self._next(len(batch))
