"""``make_client``: the blocking twin of ``engine/_sentinel.py`` (same URL forms)."""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import SSLConnection, parse_url
from redis.retry import Retry
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

from ..core.sentinel_url import is_sentinel_url, parse_sentinel_url
from ..core.urls import connection_options, redact_text

__all__ = ["make_client"]


class _AskSentinelOnReconnect:
    """Reconnect through Sentinel (see ``engine/_sentinel.py``: redis-py's
    ``send_packed_command`` reconnects to the old address otherwise)."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if not self._sock:  # type: ignore[attr-defined]
            self.connect()  # type: ignore[attr-defined]
        super().send_packed_command(command, check_health)  # type: ignore[misc]


class _Connection(_AskSentinelOnReconnect, SentinelManagedConnection):
    pass


class _SSLConnection(_AskSentinelOnReconnect, SentinelManagedSSLConnection):
    pass


class _RedactingSentinel(Sentinel):
    """redis-py's ``MasterNotFoundError`` shows each Sentinel client's repr, passwords included."""

    def discover_master(self, service_name: str) -> Any:
        try:
            return super().discover_master(service_name)  # type: ignore[no-untyped-call, unused-ignore]
        except MasterNotFoundError as exc:
            raise MasterNotFoundError(redact_text(exc)) from None


class _OwnedSentinelPool(SentinelConnectionPool):
    """Closing the client also closes its connections to the Sentinels."""

    def disconnect(self, inuse_connections: bool = True) -> None:
        super().disconnect(inuse_connections)
        if inuse_connections:
            for client in self.sentinel_manager.sentinels:
                client.close()


def make_client(url: str, **kwargs: Any) -> redis.Redis:
    """A client for ``url`` with the options of ``core.urls.connection_options`` (RESP2, TLS
    verification, timeouts, keepalive) and no redis-py retries: a command whose bytes went out
    is never sent again behind the caller's back (an XADD would be written twice)."""
    url, kwargs = connection_options(url, kwargs)
    kwargs.setdefault("retry", Retry(NoBackoff(), 0))
    if not is_sentinel_url(url):
        return redis.Redis.from_url(url, **kwargs)
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
    client = redis.Redis(connection_pool=pool, single_connection_client=single)
    client.auto_close_connection_pool = True
    return client
