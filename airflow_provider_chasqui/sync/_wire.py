"""The blocking "lane": one pinned connection that short-cuts redis-py for non-blocking calls.

redis-py's per-call machinery (pool checkout with a readiness poll, retry wrapper, response
callbacks, release) costs about as much CPU as the round trip itself.  The lane lets redis-py
open and hand-shake one connection (TLS, AUTH/ACL, ``db``, Sentinel, timeouts) and then
talks on its socket directly: hiredis packs, one ``sendall``, a hiredis ``Reader`` parses
what ``recv`` returns.  One thread at a time (a non-blocking lock: a thread that finds it
busy uses the pool, so threads never queue behind each other); re-opened after a fork.
See ``drivers_common.py`` for which calls qualify and which are re-run on redis-py after an error.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from redis import exceptions as rexc

from ..drivers_common import IDLE_CHECK_S, new_reader, supported

__all__ = ["SyncLane", "BUSY"]

BUSY = object()  # the lane is unavailable for this call: use the redis-py path
_RETRY_AFTER_S = 1.0
_READ_SIZE = 65536


class SyncLane:
    """The pinned connection of one ``SyncDriver``."""

    def __init__(self, pool: Any) -> None:
        self._pool = pool
        self._lock = threading.Lock()
        self._conn: Any = None
        self._sock: Any = None
        self._reader: Any = None
        self._pid = 0
        self._retry_at = 0.0
        self._used_at = 0.0
        self.disabled = False

    def _open(self) -> bool:
        if self.disabled or time.monotonic() < self._retry_at:
            return False
        try:
            conn = self._pool.make_connection()
        except Exception:  # noqa: BLE001 - e.g. max_connections reached: the pool path decides
            self._retry_at = time.monotonic() + _RETRY_AFTER_S
            return False
        if not supported(conn) or not hasattr(conn, "_sock"):
            self.disabled = True
            return False
        try:
            conn.connect()
        except Exception:  # noqa: BLE001 - the redis-py path reports the error itself
            self._retry_at = time.monotonic() + _RETRY_AFTER_S
            conn.disconnect()
            return False
        self._conn, self._sock, self._reader, self._pid = conn, conn._sock, new_reader(), os.getpid()
        return True

    def _drop(self) -> None:
        conn, self._conn, self._sock = self._conn, None, None
        if conn is not None:
            try:
                conn.disconnect()
            except Exception:  # noqa: BLE001 - already broken
                pass

    def _acquire(self) -> bool:
        """Hold the lock with the connection open (False: released, use the redis-py path).

        A connection idle for a while is first checked for a close by the server (idle
        ``timeout``, a restart): a write sent on it could not be re-sent (see ``_wire.py``)."""
        if not self._lock.acquire(blocking=False):
            return False
        now = time.monotonic()
        if self._pid != os.getpid():
            self._conn = self._sock = None  # the parent's socket: leave it to the parent
        elif self._sock is not None and now - self._used_at > IDLE_CHECK_S and self._closed_by_server():
            self._drop()
        self._used_at = now
        if self._sock is None and not self._open():
            self._lock.release()
            return False
        return True

    def _closed_by_server(self) -> bool:
        """Whether the idle socket is readable: the server closed it (idle ``timeout``, CLIENT
        KILL, a restart).  A stream cannot be re-run once sent, so it is checked first, as
        redis-py checks a pool connection at checkout; single calls fall back on error instead."""
        try:
            return bool(select.select([self._sock], [], [], 0)[0])
        except (OSError, ValueError):
            return True

    def _read(self, count: int) -> list[Any]:
        sock, reader = self._sock, self._reader
        replies: list[Any] = []
        while len(replies) < count:
            reply = reader.gets()
            if reply is False:
                data = sock.recv(_READ_SIZE)
                if not data:
                    raise rexc.ConnectionError("Connection closed by server.")
                reader.feed(data)
            else:
                replies.append(reply)
        return replies

    def stream(self, calls: Iterator[Any], pack: Callable[[Any], bytes]) -> Any:
        """Send each call as ``calls`` produces it, then read every reply: ``(sent calls,
        replies, the producer's exception or None)``, or ``BUSY`` before anything was sent."""
        if not self._acquire():
            return BUSY
        if self._closed_by_server():  # even when not idle: a stream cannot be re-run once sent
            self._drop()
            if not self._open():
                self._lock.release()
                return BUSY
        try:
            sent: list[Any] = []
            failed: BaseException | None = None
            try:
                sendall = self._sock.sendall
                while True:
                    try:
                        c = next(calls)
                    except StopIteration:
                        break
                    except BaseException as exc:  # noqa: BLE001 - returned once the sent calls are answered
                        failed = exc
                        break
                    sendall(pack(c))
                    sent.append(c)
                replies = self._read(len(sent))
            except BaseException as exc:
                error = self._broken(exc)
                if error is exc:
                    raise
                raise error from exc
            return sent, replies, failed
        finally:
            self._lock.release()

    def request(self, packed: bytes, count: int | None = None) -> Any:
        """Send ``packed`` (one command, or ``count`` of them) and return its reply (the list of
        ``count`` replies), or ``BUSY``.  Error replies are returned as exception instances."""
        if not self._acquire():
            return BUSY
        try:
            try:
                self._sock.sendall(packed)
                return self._read(count) if count is not None else self._read(1)[0]
            except BaseException as exc:
                error = self._broken(exc)
                if error is exc:
                    raise
                raise error from exc
        finally:
            self._lock.release()

    def _broken(self, exc: BaseException) -> BaseException:
        """Drop the connection (a reply may be half read) and say why as redis-py would."""
        self._drop()
        if isinstance(exc, socket.timeout):
            return rexc.TimeoutError("Timeout reading from Redis")
        if isinstance(exc, (OSError, ValueError)) and not isinstance(exc, rexc.RedisError):  # ValueError: hiredis
            return rexc.ConnectionError(f"Error while talking to Redis: {exc}")
        return exc

    def close(self) -> None:
        with self._lock:
            self._drop()
