"""Airflow connection fields -> validated Chasqui connection settings -> one engine URL.

Pure and Airflow-free (it must never import airflow): the hook hands over the plain fields of
a ``Connection`` and gets back a frozen :class:`ChasquiConnectionSettings`.  Extras arrive as
JSON values (UI, ``AIRFLOW_CONN_*`` JSON) or as strings (URI query), so both are accepted;
an unknown extra key is an error rather than a silently ignored typo.

Every mode becomes one URL that producers, triggers and workers share; the engine's drivers
turn it into a redis-py client: ``standalone`` is ``redis[s]://host:port/db``; ``cluster``
adds ``?cluster=true`` (a ``RedisCluster`` seeded by Host:Port, which discovers the other
nodes); ``sentinel`` is ``redis[s]+sentinel://sentinel[,sentinel...]/service/db`` (redis-py's
``Sentinel`` finds the master and follows failovers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

from ..core.codec import utf8_text
from ..errors import ConfigError

__all__ = ["ChasquiConnectionSettings", "MODES", "parse_nodes"]

MODES = ("standalone", "sentinel", "cluster")
_EXTRA_KEYS = {
    "db",
    "default_queue",
    "tls",
    "tls_verify",
    "tls_ca_certs",
    "mode",
    "sentinel_service",
    "sentinels",
    "sentinel_password",
}
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off", ""}


_TEXT_FIELDS = (
    "host",
    "username",
    "password",
    "tls_ca_certs",
    "default_queue",
    "sentinel_service",
    "sentinel_password",
)


def _as_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(f"connection extra {what!r} must be a boolean, got {value!r}")


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    raise ConfigError(f"connection {what} must be a non-negative integer, got {value!r}")


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def parse_nodes(text: str, default_port: int) -> tuple[tuple[str, int], ...]:
    """``"h1:26379, h2"`` -> ``(("h1", 26379), ("h2", default_port))``."""
    nodes = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        host, sep, port = part.rpartition(":")
        if not sep:
            host, port = part, str(default_port)
        if not host or not (port.isascii() and port.isdigit()):
            raise ConfigError(f"node {part!r} is not host:port")
        nodes.append((host, int(port)))
    if not nodes:
        raise ConfigError(f"no host:port in {text!r}")
    return tuple(nodes)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChasquiConnectionSettings:
    """Where a queue's Redis lives and how to reach it.  Immutable; safe to share."""

    mode: str = "standalone"
    host: str = "127.0.0.1"
    port: int = 6379
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    tls_verify: bool = True
    tls_ca_certs: str | None = None
    default_queue: str | None = None
    sentinel_service: str | None = None
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_password: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        for name in _TEXT_FIELDS:  # an extra is any JSON: 5 was quote()'s TypeError, a surrogate its encode error
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, str):
                    raise ConfigError(f"connection {name} must be a str, got {type(value).__name__} {value!r}")
                utf8_text(value, f"connection {name}")
        if self.mode not in MODES:
            raise ConfigError(f"connection mode must be one of {MODES}, got {self.mode!r}")
        if not (0 < self.port < 65536):
            raise ConfigError(f"port must be in 1..65535, got {self.port}")
        if self.db < 0:
            raise ConfigError(f"db must be >= 0, got {self.db}")
        if self.mode == "sentinel" and not self.sentinel_service:
            raise ConfigError("sentinel mode needs the 'sentinel_service' extra (the monitored master name)")
        if self.mode == "cluster" and self.db != 0:
            raise ConfigError("Redis Cluster has only database 0")
        if self.mode != "sentinel" and (self.sentinel_service or self.sentinels or self.sentinel_password):
            raise ConfigError(f"sentinel_* extras only apply in sentinel mode, not {self.mode}")
        if not self.tls and (self.tls_ca_certs or not self.tls_verify):
            raise ConfigError("tls_ca_certs / tls_verify need tls=true")

    # ---- building -----------------------------------------------------------------------
    @classmethod
    def from_fields(
        cls,
        *,
        host: str | None,
        port: int | None,
        login: str | None,
        password: str | None,
        schema: str | None,
        extra: Mapping[str, Any],
    ) -> ChasquiConnectionSettings:
        """Build from an Airflow ``Connection``'s fields (``schema`` may carry the db, as in a URI path)."""
        unknown = {k for k in extra if k not in _EXTRA_KEYS and not _blank(extra[k])}
        if unknown:
            raise ConfigError(f"unknown chasqui connection extras {sorted(unknown)}; known: {sorted(_EXTRA_KEYS)}")
        x = {k: v for k, v in extra.items() if not _blank(v)}
        mode = str(x.get("mode", "standalone")).strip().lower()
        port = int(port) if port else (26379 if mode == "sentinel" and "sentinels" not in x else 6379)
        host = host or "127.0.0.1"
        db = _as_int(x["db"], "db") if "db" in x else 0
        if not _blank(schema):
            from_path = _as_int(schema, "schema (db)")
            if "db" in x and from_path != db:
                raise ConfigError(f"db given twice: schema {from_path} and extra {db}")
            db = from_path
        sentinels = parse_nodes(str(x["sentinels"]), 26379) if "sentinels" in x else None
        return cls(
            mode=mode,
            host=host,
            port=port,
            db=db,
            username=login or None,
            password=password or None,
            tls=_as_bool(x.get("tls", False), "tls"),
            tls_verify=_as_bool(x.get("tls_verify", True), "tls_verify"),
            tls_ca_certs=x.get("tls_ca_certs"),
            default_queue=x.get("default_queue"),
            sentinel_service=x.get("sentinel_service"),
            sentinels=sentinels or (((host, port),) if mode == "sentinel" else ()),
            sentinel_password=x.get("sentinel_password"),
        )

    def queue_name(self, explicit: str | None) -> str:
        """The queue to use: the explicit one, else the connection's ``default_queue``."""
        name = explicit or self.default_queue
        if not name:
            raise ConfigError("no queue name: pass queue_name or set 'default_queue' on the connection")
        return name

    # ---- the URL ---------------------------------------------------------------------------
    def redis_url(self) -> str:
        """The engine URL of this connection (see the module docstring); secrets are quoted."""
        auth = ""
        if self.username or self.password:
            auth = quote(self.username or "", safe="")
            if self.password:
                auth += ":" + quote(self.password, safe="")
            auth += "@"
        scheme = "rediss" if self.tls else "redis"
        query = self._tls_query()
        if self.mode == "sentinel":
            hosts = ",".join(f"{_host(h)}:{p}" for h, p in self.sentinels)
            if self.sentinel_password:
                query["sentinel_password"] = self.sentinel_password
            url = f"{scheme}+sentinel://{auth}{hosts}/{quote(self.sentinel_service or '', safe='')}/{self.db}"
        else:
            url = f"{scheme}://{auth}{_host(self.host)}:{self.port}/{self.db}"
        if self.mode == "cluster":
            query["cluster"] = "true"
        return url + ("?" + urlencode(query) if query else "")

    def _tls_query(self) -> dict[str, str]:
        out: dict[str, str] = {}
        if self.tls and not self.tls_verify:
            out["ssl_cert_reqs"] = "none"
        if self.tls_ca_certs:
            out["ssl_ca_certs"] = self.tls_ca_certs
        return out
