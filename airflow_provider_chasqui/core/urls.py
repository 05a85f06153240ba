"""Connection-URL options of this project that redis-py does not know.

``?cluster=true`` (or ``cluster=True`` passed to a driver) selects the Redis Cluster client;
the option is removed from the URL before redis-py parses it.  Pure string handling.
"""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..errors import ConfigError

__all__ = ["split_cluster_flag"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def split_cluster_flag(url: str, cluster: object = None) -> tuple[str, bool]:
    """``(url without the cluster option, whether to use the cluster client)``.

    An explicit ``cluster`` argument wins over the URL's ``?cluster=`` value.
    """
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    from_url: bool | None = None
    kept = []
    for name, value in query:
        if name.lower() != "cluster":
            kept.append((name, value))
            continue
        low = value.strip().lower()
        if low in _TRUE:
            from_url = True
        elif low in _FALSE:
            from_url = False
        else:
            raise ConfigError(f"cluster= in the Redis URL must be true or false, got {value!r}")
    if cluster is not None and not isinstance(cluster, bool):
        raise ConfigError(f"cluster must be a bool, got {type(cluster).__name__}")
    flag = cluster if cluster is not None else bool(from_url)
    if from_url is None:
        return url, flag
    return urlunsplit(parts._replace(query=urlencode(kept))), flag


# ---- the options every client of this package is opened with -------------------------------------
__all__ += ["connection_options", "with_tls", "read_timeout", "PROTOCOL", "CONNECT_TIMEOUT_SECS", "IO_MARGIN_SECS",
            "WAIT_BLOCK_MS"]

PROTOCOL = 2  # the lanes and the reply parsers read RESP2 only; redis-py 8 defaults to RESP3
CONNECT_TIMEOUT_SECS = 10.0
IO_MARGIN_SECS = 10.0  # a reply's allowance beyond the longest BLOCK of a client's own blocking reads
WAIT_BLOCK_MS = 10_000  # longest XREAD BLOCK of wait_for_result(s); a longer wait reads again
_NO_VERIFY = ("none", "cert_none")


def read_timeout(block_ms: float = 0) -> float:
    """The socket timeout of a client whose longest blocking read is ``block_ms``."""
    return block_ms / 1000 + IO_MARGIN_SECS


def with_tls(url: str, tls: object) -> str:
    """``url`` with TLS when ``tls`` is true: ``redis://`` -> ``rediss://`` and
    ``redis+sentinel://`` -> ``rediss+sentinel://`` (TLS to the master); a unix socket
    cannot be upgraded (ConfigError, never a silent plain connection)."""
    if not isinstance(tls, bool):
        raise ConfigError(f"tls must be a bool, got {type(tls).__name__}")
    if not tls:
        return url
    scheme, sep, rest = url.partition("://")
    low = scheme.lower()
    if sep and low in ("redis", "redis+sentinel"):
        return "rediss" + scheme[len("redis"):] + sep + rest
    if sep and low in ("rediss", "rediss+sentinel"):
        return url
    raise ConfigError(f"tls=True needs a redis:// or redis+sentinel:// URL, not {scheme + sep!r} "
                      "(a unix socket has no TLS)")


def connection_options(url: str, kwargs: dict[str, object]) -> tuple[str, dict[str, object]]:
    """``(url, kwargs)`` for redis-py with this project's explicit choices.

    RESP2 always: ``protocol=`` anything else in the URL or the arguments is a ConfigError
    (redis-py lets URL options override arguments, so the URL's own is removed).  Defaults an
    argument or the URL overrides: ``socket_keepalive=True``, ``socket_connect_timeout``
    (:data:`CONNECT_TIMEOUT_SECS`), ``socket_timeout`` (:func:`read_timeout`; a client with
    blocking reads passes a longer one) and, for ``rediss://``, certificate and hostname
    verification (``ssl_cert_reqs=required``, ``ssl_check_hostname=True``: redis-py 5 leaves
    the hostname unchecked by default).  Pure: the drivers add redis-py's own objects.
    """
    out = dict(kwargs)
    if "protocol" in out and str(out["protocol"]) != str(PROTOCOL):
        raise ConfigError(f"protocol={out['protocol']!r}: Chasqui speaks RESP2 only (protocol=2)")
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {name.lower(): value for name, value in query}
    if "protocol" in options:
        if options["protocol"].strip() != str(PROTOCOL):
            raise ConfigError(f"protocol={options['protocol']!r} in the Redis URL: Chasqui speaks RESP2 only "
                              "(protocol=2)")
        url = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k.lower() != "protocol"])))
    out["protocol"] = PROTOCOL
    out.setdefault("socket_keepalive", True)
    out.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_SECS)
    out.setdefault("socket_timeout", read_timeout())
    if parts.scheme.lower().startswith("rediss"):
        out.setdefault("ssl_cert_reqs", "required")
        reqs = options.get("ssl_cert_reqs", out["ssl_cert_reqs"])  # a str, an ssl.VerifyMode or None
        verify = reqs is not None and str(getattr(reqs, "name", reqs)).lower() not in _NO_VERIFY
        out.setdefault("ssl_check_hostname", verify)  # redis-py 5 refuses it on without verification
    return url, out
