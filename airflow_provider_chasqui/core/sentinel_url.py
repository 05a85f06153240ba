"""``redis+sentinel://`` URLs: a master found through Redis Sentinel, named by one string.

``redis+sentinel://[[user]:password@]host[:port][,host[:port]...]/service_name[/db][?options]``
(``rediss+sentinel://`` for TLS to the master).  ``host:port`` are the Sentinels (port 26379
by default); ``user:password`` authenticate to the master; ``sentinel_username`` and
``sentinel_password`` in the query authenticate to the Sentinels; every other query option is
a redis-py connection option of the master (``socket_timeout``, ``ssl_ca_certs``...).

Pure string handling: the drivers turn the result into a redis-py client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlencode

from ..errors import ConfigError

__all__ = ["SentinelTarget", "is_sentinel_url", "parse_sentinel_url", "DEFAULT_SENTINEL_PORT"]

DEFAULT_SENTINEL_PORT = 26379
_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}
_SENTINEL_OPTIONS = {"sentinel_password": "password", "sentinel_username": "username"}


@dataclass(frozen=True, slots=True)
class SentinelTarget:
    """Where the Sentinels are, which master to ask them for, and how to talk to it."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    node_url: str  # redis[s]://[auth@]sentinel/db?options: the master's options for redis-py's parse_url
    sentinel_kwargs: dict[str, str] = field(default_factory=dict, repr=False)


def is_sentinel_url(url: object) -> bool:
    return isinstance(url, str) and url.partition("://")[0].lower() in _SCHEMES


def _hosts(text: str) -> tuple[tuple[str, int], ...]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("["):  # [IPv6]:port
            host, _, tail = part[1:].partition("]")
            port = tail[1:] if tail.startswith(":") else ""
        else:
            host, sep, port = part.rpartition(":")
            if not sep:
                host, port = part, ""
        if not host or (port and not port.isdigit()) or not 0 < int(port or DEFAULT_SENTINEL_PORT) < 65536:
            raise ConfigError(f"sentinel address {part!r} is not host[:port]")
        out.append((unquote(host), int(port or DEFAULT_SENTINEL_PORT)))
    if not out:
        raise ConfigError("a redis+sentinel:// URL needs at least one sentinel host")
    return tuple(out)


def parse_sentinel_url(url: str) -> SentinelTarget:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in _SCHEMES:
        raise ConfigError(f"not a redis+sentinel:// or rediss+sentinel:// URL: {url.split('@')[-1]!r}")
    rest = rest.partition("#")[0]
    rest, _, query = rest.partition("?")
    netloc, _, path = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    parts = [p for p in path.split("/") if p]
    if not parts or len(parts) > 2:
        raise ConfigError("a redis+sentinel:// URL needs /service_name[/db] after the sentinels")
    service = unquote(parts[0])
    db = parts[1] if len(parts) == 2 else "0"
    if not db.isdigit():
        raise ConfigError(f"the database in a redis+sentinel:// URL must be a number, got {db!r}")
    options, sentinel_kwargs = [], {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name in _SENTINEL_OPTIONS:
            sentinel_kwargs[_SENTINEL_OPTIONS[name]] = value
        else:
            options.append((name, value))
    node_scheme = "rediss" if _SCHEMES[scheme.lower()] else "redis"
    node_url = f"{node_scheme}://{auth + '@' if at else ''}sentinel/{db}" + (
        f"?{urlencode(options)}" if options else ""
    )
    return SentinelTarget(_hosts(hosts), service, node_url, sentinel_kwargs)
