"""Who may reach the dashboard from a browser: the ``Host`` it is served under, the origin a
change comes from, and who may frame its pages.

* **DNS rebinding.**  A page on ``evil.example`` whose name rebinds to 127.0.0.1 is same-origin
  with itself, so the browser lets it read and post to a loopback dashboard; only the ``Host``
  header gives it away.  With ``allowed_hosts`` (the loopback server passes its loopback names),
  any other ``Host`` is refused (400) before a route runs.
* **Cross-site changes.**  A change (any method but GET/HEAD/OPTIONS) whose ``Origin`` is not the
  dashboard's own (``Host``, or ``X-Forwarded-Host`` behind a proxy: a cross-site page cannot set
  it without a CORS preflight, which the dashboard never grants), or that the browser marks
  ``Sec-Fetch-Site: cross-site``, is refused (403), on top of the forms' check value.
* **Framing.**  Every response says who may frame it: ``frame-ancestors 'none'`` with
  ``X-Frame-Options: DENY`` standalone, ``'self'`` with ``SAMEORIGIN`` inside Airflow's UI.

A pure ASGI middleware: nothing is buffered, and a refused request costs no Redis read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any
from urllib.parse import urlsplit

__all__ = ["OriginGuard", "host_name"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_FRAMING = {"none": b"DENY", "self": b"SAMEORIGIN"}


def host_name(host: str) -> str:
    """The name part of a ``Host`` value, lower case: ``[::1]:8377`` -> ``::1``,
    ``LocalHost:80`` -> ``localhost``; ``""`` for a value that is not one."""
    host = host.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[1:end] if end > 0 else ""
    if host.count(":") > 1:  # a bare IPv6 address (no port can be told apart): take it whole
        return host
    return host.partition(":")[0]


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return str(value.decode("latin-1"))
    return None


class OriginGuard:
    """See the module docstring."""

    def __init__(
        self, app: ASGIApp, *, allowed_hosts: Collection[str] | None = None, frame_ancestors: str = "none"
    ) -> None:
        if frame_ancestors not in _FRAMING:
            raise ValueError(f"frame_ancestors must be one of {sorted(_FRAMING)}, got {frame_ancestors!r}")
        self.app = app
        self.allowed = None if allowed_hosts is None else frozenset(host_name(h) for h in allowed_hosts)
        self.headers = [
            (b"x-frame-options", _FRAMING[frame_ancestors]),
            (b"content-security-policy", f"frame-ancestors '{frame_ancestors}'".encode()),
            (b"x-content-type-options", b"nosniff"),
            (b"referrer-policy", b"same-origin"),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self._refusal(scope)
        if refusal is not None:
            status, text = refusal
            await self._plain(send, status, text)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), *self.headers]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _refusal(self, scope: Scope) -> tuple[int, str] | None:
        host = _header(scope, b"host") or ""
        if self.allowed is not None and host_name(host) not in self.allowed:
            return 400, f"this dashboard is not served under the host name {host_name(host)!r}"
        if scope.get("method", "GET") in _SAFE_METHODS:
            return None
        if _header(scope, b"sec-fetch-site") == "cross-site":
            return 403, "a change from another site is refused"
        origin = _header(scope, b"origin")
        if origin is None:
            return None  # not a browser's cross-origin request (browsers send Origin on every POST)
        own = {host.strip().lower()}
        forwarded = _header(scope, b"x-forwarded-host")
        if forwarded:
            own.add(forwarded.split(",")[0].strip().lower())
        seen = urlsplit(origin.strip().lower()).netloc if origin.strip().lower() != "null" else ""
        if not seen or seen not in own:
            return 403, f"a change from the origin {origin!r} is refused: it is not this dashboard's"
        return None

    async def _plain(self, send: Send, status: int, text: str) -> None:
        body = text.encode("utf-8", "replace")
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    *self.headers,
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
