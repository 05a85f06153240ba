"""``make_client``: a ``redis.asyncio`` client for a ``redis://``, ``rediss://`` or
``redis[s]+sentinel://`` URL (see :mod:`..core.sentinel_url`).

A Sentinel client asks the Sentinels for the master on every (re)connect, so after a
failover the next reconnect reaches the new master; a connection still open to the demoted
one fails with READONLY or is closed by Sentinel, and the engine's retry loops reconnect.
As with ``from_url``, options in the URL win over keyword arguments.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import SSLConnection, parse_url
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)
from redis.backoff import NoBackoff

from ..core.sentinel_url import is_sentinel_url, parse_sentinel_url
from ..core.urls import connection_options, redact_text

__all__ = ["make_client"]


class _AskSentinelOnReconnect:
    """redis-py (6.4) reconnects a dropped connection inside ``send_packed_command`` with
    ``connect_check_health()``, which skips ``SentinelManagedConnection.connect()`` and so goes
    back to the old address: a connection reused after a failover (the worker's single
    connection reader) would retry the demoted master for ever.  Reconnect through Sentinel."""

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self.is_connected:  # type: ignore[attr-defined]
            await self.connect()  # type: ignore[attr-defined]
        await super().send_packed_command(command, check_health)  # type: ignore[misc]


class _Connection(_AskSentinelOnReconnect, SentinelManagedConnection):
    pass


class _SSLConnection(_AskSentinelOnReconnect, SentinelManagedSSLConnection):
    pass


class _RedactingSentinel(Sentinel):
    """redis-py's ``MasterNotFoundError`` shows each Sentinel client's repr, passwords included."""

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except MasterNotFoundError as exc:
            raise MasterNotFoundError(redact_text(exc)) from None


class _OwnedSentinelPool(SentinelConnectionPool):
    """Closing the client also closes its connections to the Sentinels."""

    async def disconnect(self, inuse_connections: bool = True) -> None:
        await super().disconnect(inuse_connections)
        if inuse_connections:
            for client in self.sentinel_manager.sentinels:
                await client.aclose()


def make_client(url: str, **kwargs: Any) -> aioredis.Redis:
    """A client for ``url`` with the options of ``core.urls.connection_options`` (RESP2, TLS
    verification, timeouts, keepalive) and no redis-py retries: a command whose bytes went out
    is never sent again behind the caller's back (an XADD would be written twice)."""
    url, kwargs = connection_options(url, kwargs)
    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    if not is_sentinel_url(url):
        return aioredis.Redis.from_url(url, **kwargs)
    target = parse_sentinel_url(url)
    single = bool(kwargs.pop("single_connection_client", False))
    options = parse_url(target.node_url)
    options.pop("host", None)
    options.pop("port", None)
    ssl = options.pop("connection_class", None) is SSLConnection or bool(kwargs.pop("ssl", False))
    merged = {**kwargs, **options, "connection_class": _SSLConnection if ssl else _Connection}
    sentinel_kwargs: dict[str, Any] = {k: v for k, v in merged.items() if k.startswith("socket_") or k == "protocol"}
    sentinel_kwargs.update(target.sentinel_kwargs)
    # redis-py's SentinelConnectionPool constructor is unannotated (Sentinel's too before redis-py 8)
    sentinel = _RedactingSentinel(list(target.sentinels), sentinel_kwargs=sentinel_kwargs, **merged)  # type: ignore[no-untyped-call, unused-ignore]
    pool = _OwnedSentinelPool(target.service, sentinel, is_master=True, **sentinel.connection_kwargs)  # type: ignore[no-untyped-call]
    client = aioredis.Redis(connection_pool=pool, single_connection_client=single)
    client.auto_close_connection_pool = True
    return client
