"""The asyncio "lane": one pinned connection that short-cuts redis.asyncio for non-blocking calls.

redis.asyncio spends about 60 us of Python per command (pool checkout, StreamReader,
retry wrapper, per-argument packing); a one-by-one ``Queue.add`` was a quarter of a sync
client's speed.  The lane lets redis-py open and hand-shake the connection (TLS, AUTH/ACL,
``db``, Sentinel address lookup, timeouts) and then takes over its transport with a small
``asyncio.Protocol``: commands are packed by hiredis and written at once, replies are parsed
by a hiredis ``Reader`` in ``data_received`` and matched FIFO to one future per call, so
concurrent callers pipeline on the one connection.  Blocking commands never use it (see
``lane_ok``).  Any connection error is reported as a redis-py exception.  A call whose bytes
went out may have run, so only a read (``resend_ok``) is re-run on the driver's redis-py
client; a write (an XADD, a script) raises instead of being written twice behind the caller.
"""

from __future__ import annotations

import asyncio
import collections
import select
import time
from typing import Any

from redis import exceptions as rexc

from ..drivers_common import (
    IDLE_CHECK_S,
    LANE_COMMANDS,
    lane_ok,
    new_reader,
    pack_call,
    resend_ok,
    supported,
)

__all__ = ["LANE_COMMANDS", "AsyncLane", "lane_ok", "new_reader", "pack_call", "resend_ok"]

_RETRY_AFTER_S = 1.0  # after the lane failed to connect, use the redis-py path for this long


class _Protocol(asyncio.Protocol):
    """Writes packed commands; answers the oldest waiting future with each parsed reply."""

    def __init__(self, transport: Any, timeout: float | None) -> None:
        self.transport = transport
        self.reader = new_reader()
        self.waiters: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.sent_at: collections.deque[float] = collections.deque()
        self.timeout = timeout
        self.closed = False
        self.owner: Any = None
        self._timer: asyncio.TimerHandle | None = None
        self.loop = asyncio.get_running_loop()
        self.last_send = self.loop.time()
        sock = transport.get_extra_info("socket")
        self.fd = sock.fileno() if sock is not None else -1

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        fut = self.loop.create_future()
        self.waiters.append(fut)
        now = self.last_send = self.loop.time()
        if self.timeout is not None:
            self.sent_at.append(now)
            if self._timer is None:
                self._timer = self.loop.call_at(now + self.timeout, self._check_timeout)
        self.transport.write(packed)
        return fut

    def data_received(self, data: bytes) -> None:
        reader = self.reader
        reader.feed(data)
        waiters, timed = self.waiters, self.timeout is not None
        while True:
            try:
                reply = reader.gets()
            except Exception as exc:  # noqa: BLE001 - a protocol error poisons the connection
                self._fail(rexc.ConnectionError(f"protocol error: {exc}"))
                self.transport.abort()
                return
            if reply is False:
                return
            if not waiters:  # an unsolicited reply: the stream is out of step
                self._fail(rexc.ConnectionError("unexpected reply from Redis"))
                self.transport.abort()
                return
            fut = waiters.popleft()
            if timed:
                self.sent_at.popleft()
            if not fut.done():  # its caller may have been cancelled
                fut.set_result(reply)

    def peer_closed(self) -> bool:
        """With no call in flight, a readable socket means the server closed it (or broke step)."""
        try:
            return self.fd < 0 or bool(select.select([self.fd], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost fails the waiters

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(
            rexc.ConnectionError(f"Connection closed by server: {exc}" if exc else "Connection closed by server.")
        )

    def _fail(self, exc: Exception) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiters, self.waiters = self.waiters, collections.deque()
        self.sent_at.clear()
        for fut in waiters:
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # its caller may be gone: no "never retrieved" log; await still raises

    def _check_timeout(self) -> None:
        """One timer per connection, not per call: the oldest unanswered call decides."""
        self._timer = None
        if self.closed or not self.sent_at:
            return
        due = self.sent_at[0] + self.timeout  # type: ignore[operator]
        if self.loop.time() >= due:
            self._fail(rexc.TimeoutError("Timeout reading from Redis"))
            self.transport.abort()
        else:
            self._timer = self.loop.call_at(due, self._check_timeout)


class AsyncLane:
    """The pinned connection of one ``AsyncDriver``; (re)opened lazily, owned by one event loop."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self.proto: _Protocol | None = None
        self._opening: asyncio.Future[Any] | None = None
        self._retry_at = 0.0
        self.disabled = False

    def live(self) -> _Protocol | None:
        """The connected protocol if it serves the running event loop, without awaiting."""
        proto = self.proto
        if proto is None or proto.closed or proto.loop is not asyncio.get_running_loop():
            return None
        if not proto.waiters and proto.loop.time() - proto.last_send > IDLE_CHECK_S and proto.peer_closed():
            self.close()  # closed while idle and not yet seen: reopen rather than write on it
            return None
        return proto

    async def open(self) -> _Protocol | None:
        """The connected protocol, or None (the caller then uses redis-py)."""
        proto = self.proto
        if proto is not None and not proto.closed:
            if proto.loop is asyncio.get_running_loop():
                return proto
            self.close()  # opened on an event loop that is gone (a driver reused across asyncio.run)
        if self.disabled or time.monotonic() < self._retry_at:
            return None
        if self._opening is not None:  # another task is connecting: wait for it
            return await asyncio.shield(self._opening)
        opening = self._opening = asyncio.get_running_loop().create_future()
        proto = None
        try:
            proto = await self._connect()
        except Exception:  # noqa: BLE001 - the redis-py path reports the error itself
            self._retry_at = time.monotonic() + _RETRY_AFTER_S
        finally:  # even when cancelled: the tasks waiting on ``opening`` fall back to redis-py
            self._opening = None
            self.proto = proto
            opening.set_result(proto)
        return proto

    async def _connect(self) -> _Protocol | None:
        conn = self._pool.make_connection()
        if not supported(conn):
            self.disabled = True
            return None
        await conn.connect()
        reader, writer = getattr(conn, "_reader", None), getattr(conn, "_writer", None)
        transport = getattr(writer, "transport", None)
        buffered = getattr(reader, "_buffer", b"")
        if transport is None or buffered or not hasattr(transport, "set_protocol"):
            await conn.disconnect()
            self.disabled = True
            return None
        proto = _Protocol(transport, getattr(conn, "socket_timeout", None))
        transport.set_protocol(proto)
        # the transport is ours now; the StreamWriter closes it when collected, so it lives as
        # long as the protocol, and redis-py's connection forgets it
        proto.owner = writer
        conn._reader = conn._writer = None
        return proto

    def close(self) -> None:
        proto, self.proto = self.proto, None
        if proto is not None:
            proto.closed = True
            try:
                proto.transport.close()
            except RuntimeError:  # its event loop is closed: asyncio can no longer close it
                pass
            if proto.loop.is_closed():
                _close_orphan(proto.transport)


def _close_orphan(transport: Any) -> None:
    """Close the socket of a transport whose event loop is closed (``asyncio.run`` ended):
    ``transport.close()`` only schedules that on the loop, so the socket (one per loop the
    driver was used on) stayed open until collected, with a ResourceWarning."""
    inner: Any = getattr(getattr(transport, "_ssl_protocol", None), "_transport", None)  # TLS: the socket's transport
    for t in (transport, inner):
        if t is None:
            continue
        if t is inner:
            try:
                t.close()  # marks it closing (the StreamWriter checks that when collected)
            except RuntimeError:
                pass
        sock = getattr(t, "_sock", None)
        if sock is not None:
            sock.close()
            t._sock = None
