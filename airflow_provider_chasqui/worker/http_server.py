"""The small HTTP server behind ``/metrics``, ``/livez`` and ``/readyz`` (``worker/metrics.py``):
GET only, nothing authenticated, so it holds no thread per client.  One selector thread reads
request heads (at most 8 KiB, within ``header_timeout`` seconds, at most ``max_connections``
open: the oldest is dropped for a new one); a fixed pool of ``workers`` threads answers
complete heads through ``respond(path)`` with ``Connection: close``.
"""

from __future__ import annotations

import logging
import queue as queue_mod
import selectors
import socket
import threading
import time
from collections.abc import Callable

__all__ = ["HttpServer"]

log = logging.getLogger("airflow_provider_chasqui.worker.metrics")  # the server's lines are the metrics' lines

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_MAX_HEAD = 8192


class HttpServer:
    """GET-only HTTP/1.0-style server: a selector thread collects request heads, a fixed pool
    answers them (see the module docstring for the limits)."""

    def __init__(
        self,
        host: str,
        port: int,
        respond: Callable[[str], tuple[int, bytes, str]],
        *,
        header_timeout: float,
        max_connections: int,
        workers: int,
    ) -> None:
        self._respond = respond
        self._header_timeout = header_timeout
        self._max = max_connections
        self._workers = workers
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=max(16, max_connections))
        self._sock.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._open: dict[socket.socket, tuple[float, bytearray]] = {}  # heads being read, by start time
        self._ready: queue_mod.Queue[tuple[socket.socket, bytes] | None] = queue_mod.Queue(max_connections)
        self._stop = threading.Event()

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    @property
    def host(self) -> str:
        return str(self._sock.getsockname()[0])

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._select_loop, name="chasqui-metrics-http", daemon=True)]
        threads += [
            threading.Thread(target=self._answer_loop, name=f"chasqui-metrics-http-{i}", daemon=True)
            for i in range(self._workers)
        ]
        for t in threads:
            t.start()
        return threads

    def stop(self) -> None:
        self._stop.set()
        for _ in range(self._workers):
            try:
                self._ready.put(None, timeout=1)
            except queue_mod.Full:
                break

    def _drop(self, conn: socket.socket) -> None:
        if self._open.pop(conn, None) is not None:
            self._sel.unregister(conn)
        conn.close()

    def _select_loop(self) -> None:
        try:
            while not self._stop.is_set():
                for key, _ in self._sel.select(timeout=0.2):
                    if key.fileobj is self._sock:
                        self._accept()
                    else:
                        self._read(key.fileobj)  # type: ignore[arg-type]
                deadline = time.monotonic() - self._header_timeout
                for conn in [c for c, (t, _) in self._open.items() if t < deadline]:
                    self._drop(conn)  # a client that never finished its request
        finally:
            for conn in list(self._open):
                self._drop(conn)
            self._sel.close()
            self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and friends: keep serving the connections we have
                log.warning("metrics http: accept failed: %s", exc)
                return
            if len(self._open) >= self._max:
                self._drop(min(self._open, key=lambda c: self._open[c][0]))  # the oldest unfinished request
            conn.setblocking(False)
            self._open[conn] = (time.monotonic(), bytearray())
            self._sel.register(conn, selectors.EVENT_READ)

    def _read(self, conn: socket.socket) -> None:
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        buf = self._open[conn][1]
        buf += chunk
        if b"\r\n\r\n" not in buf and b"\n\n" not in buf and len(buf) <= _MAX_HEAD:
            return
        self._open.pop(conn)
        self._sel.unregister(conn)
        try:
            self._ready.put_nowait((conn, bytes(buf)))
        except queue_mod.Full:  # every answering thread is busy and the queue is full
            conn.close()

    def _answer_loop(self) -> None:
        while True:
            item = self._ready.get()
            if item is None:
                return
            conn, head = item
            try:
                conn.settimeout(self._header_timeout)
                status, body, ctype = self._answer(head)
                conn.sendall(
                    f"HTTP/1.1 {status} {_REASONS.get(status, '')}\r\nContent-Type: {ctype}\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
            except OSError as exc:
                log.debug("metrics http: could not answer: %s", exc)
            finally:
                conn.close()

    def _answer(self, head: bytes) -> tuple[int, bytes, str]:
        if len(head) > _MAX_HEAD:
            return 431, b"request head too large\n", "text/plain; charset=utf-8"
        parts = head.split(b"\r\n" if b"\r\n" in head else b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            return 400, b"bad request\n", "text/plain; charset=utf-8"
        if parts[0] != b"GET":
            return 405, b"GET only\n", "text/plain; charset=utf-8"
        path = parts[1].split(b"?", 1)[0].decode("latin-1")
        try:
            return self._respond(path)
        except Exception:  # a bug must not kill the answering thread; details go to the log
            log.exception("metrics http: %s failed", path)
            return 500, b"internal error\n", "text/plain; charset=utf-8"
