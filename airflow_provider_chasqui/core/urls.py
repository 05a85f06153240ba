"""Connection-URL options of this project that redis-py does not know, and secret redaction.

``?cluster=true`` (or ``cluster=True`` passed to a driver) selects the Redis Cluster client;
the option is removed from the URL before redis-py parses it.  :func:`redact_url` and
:func:`redact_text` are the one way any log line, error or CLI message shows a URL.  Pure
string handling.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from ..errors import ConfigError, ConfigTypeError

__all__ = ["split_cluster_flag", "redact_url", "redact_text", "check_url", "REDACTED", "DEFAULT_URL"]

DEFAULT_URL = "redis://127.0.0.1:6379"  # both queue twins' default

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


# ---- redaction --------------------------------------------------------------------------------
REDACTED = "***"
#: A query option or ``key=value`` whose name contains one of these holds a secret.
_SECRET_WORDS = ("pass", "token", "secret", "credential")
_URL_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_SECRET_KV = re.compile(
    r"""(?P<key>(?P<q>['"]?)[\w.-]*(?:pass|token|secret|credential)[\w.-]*(?P=q)\s*[=:]\s*)"""
    r"""(?P<value>'[^']*'|"[^"]*"|[^\s,;&)}\]'"]+)""",
    re.IGNORECASE,
)


def _is_secret_name(name: str) -> bool:
    low = unquote(name).lower()
    return any(word in low for word in _SECRET_WORDS)


def _redact_query(query: str) -> str:
    parts = re.split(r"([&;])", query)
    for i in range(0, len(parts), 2):
        name, eq, _value = parts[i].partition("=")
        if eq and _is_secret_name(name):
            parts[i] = f"{name}={REDACTED}"
    return "".join(parts)


def redact_url(url: object) -> str:
    """``url`` with its secrets replaced by ``***``: the password of the userinfo (the whole
    userinfo when it has no ``user:`` part) and every query option whose name contains
    "pass", "token", "secret" or "credential" (``password``, ``sentinel_password``,
    ``ssl_password``...).  Hosts, ports, paths and other options stay, so the message still
    says where.  Robust to unescaped ``@ : / %`` in the password: the userinfo ends at the
    last ``@`` that is not inside the query.  Never raises; a non-string is shown as ``str()``.
    """
    text = str(url)
    scheme, sep, rest = text.partition("://")
    if not sep:
        head, q, query = text.partition("?")
        return head + q + _redact_query(query) if q else text
    at = rest.rfind("@")
    while at != -1:  # an '@' inside a "name=value" query option is not the end of the userinfo
        qpos = rest.find("?", 0, at)
        if qpos == -1 or "=" not in rest[qpos:at]:
            break
        at = rest.rfind("@", 0, qpos)
    auth = ""
    if at != -1:
        user, colon, _password = rest[:at].partition(":")
        auth = f"{user}:{REDACTED}@" if colon else f"{REDACTED}@"
        rest = rest[at + 1 :]
    head, q, query = rest.partition("?")
    return f"{scheme}://{auth}{head}" + (q + _redact_query(query) if q else "")


def redact_text(text: object) -> str:
    """Free text (an exception message, a log record) with secrets removed: each URL in it
    through :func:`redact_url`, then ``password=...``-like pairs (as in redis-py's connection
    reprs, ``password=s3cret,``) replaced by ``***``."""
    out = _URL_TOKEN.sub(lambda m: redact_url(m.group(0)), str(text))
    return _SECRET_KV.sub(lambda m: m.group("key") + REDACTED, out)


def check_url(url: object) -> str:
    """``url`` if redis-py (or the Sentinel parser) can read it, else a ``ConfigError`` that
    shows it redacted: a parser's own message may quote a piece of a mis-escaped password.
    A path that is not a database number is refused too: redis-py ignores it (db 0)."""
    from .sentinel_url import is_sentinel_url, parse_sentinel_url

    if not isinstance(url, str):
        raise ConfigTypeError(f"a Redis URL must be a str, got {type(url).__name__}")
    try:
        url.encode("utf-8")
        if is_sentinel_url(url):
            parse_sentinel_url(url)
        else:
            parts = urlsplit(split_cluster_flag(url)[0])
            if parts.scheme not in ("redis", "rediss", "unix") or (parts.scheme != "unix" and not parts.hostname):
                raise ValueError("scheme or host")
            parts.port  # noqa: B018 - raises on a non-numeric port
            db = unquote(parts.path).replace("/", "")  # as redis-py reads it, ignoring what int() refuses
            if parts.scheme != "unix" and db and not (db.isascii() and db.isdigit()):
                raise ValueError("db")
    except (ValueError, UnicodeEncodeError):
        raise ConfigError(
            f"not a valid Redis URL: {redact_url(url)} (redis[s]://[[user]:password@]host[:port]"
            "[/db][?options] or redis[s]+sentinel://...; percent-encode @ : / % in the password, "
            "e.g. @ as %40)"
        ) from None
    return url


# ---- the options every client of this package is opened with -------------------------------------
__all__ += [
    "connection_options",
    "client_url",
    "read_timeout",
    "PROTOCOL",
    "CONNECT_TIMEOUT_SECS",
    "IO_MARGIN_SECS",
    "WAIT_BLOCK_MS",
]

PROTOCOL = 2  # the lanes and the reply parsers read RESP2 only; redis-py 8 defaults to RESP3
CONNECT_TIMEOUT_SECS = 10.0
IO_MARGIN_SECS = 10.0  # a reply's allowance beyond the longest BLOCK of a client's own blocking reads
WAIT_BLOCK_MS = 10_000  # longest XREAD BLOCK of wait_for_result(s); a longer wait reads again
_NO_VERIFY = ("none", "cert_none")


def read_timeout(block_ms: float = 0) -> float:
    """The socket timeout of a client whose longest blocking read is ``block_ms``."""
    return block_ms / 1000 + IO_MARGIN_SECS


# host[:port] with no scheme: a DNS name or an IPv4 address, or a bracketed IPv6 one
_BARE_ENDPOINT = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})|\[[0-9A-Fa-f:.]{2,45}\])(?::[0-9]{1,5})?", re.ASCII
)


def client_url(url: object, tls: object) -> str:
    """A constructor's ``redis_url`` checked (:func:`check_url`: a URL of another type or
    redis-py cannot read was its ``AttributeError`` or ``ValueError`` at the first call), with
    TLS when ``tls`` is true: ``redis://`` -> ``rediss://`` and ``redis+sentinel://`` ->
    ``rediss+sentinel://`` (TLS to the master); a unix socket cannot be upgraded (ConfigError,
    never a silent plain connection).  With ``tls``, a bare ``host:port`` (an endpoint as a cloud
    console shows it: ``my-cluster.cache.amazonaws.com:6379``) is ``rediss://host:port``, as
    chasquimq's ``apply_tls`` makes it."""
    if not isinstance(tls, bool):
        raise ConfigError(f"tls must be a bool, got {type(tls).__name__}")
    if isinstance(url, str) and _BARE_ENDPOINT.fullmatch(url):
        if not tls:
            raise ConfigError(
                f"{url[:200]!r} has no scheme: write redis://{url[:200]} (or rediss://, or pass tls=True)"
            )
        url = "rediss://" + url
    url = check_url(url)
    if not tls:
        return url
    scheme, sep, rest = url.partition("://")
    low = scheme.lower()
    if sep and low in ("redis", "redis+sentinel"):
        return "rediss" + scheme[len("redis") :] + sep + rest
    if sep and low in ("rediss", "rediss+sentinel"):
        return url
    raise ConfigError(
        f"tls=True needs a redis:// or redis+sentinel:// URL, not {scheme + sep!r} (a unix socket has no TLS)"
    )


# URL -> the redis-py CredentialProvider every client of that URL authenticates with
# (``credentials.register``: chasquimq's ``credential_provider=``); data only, the core calls nothing
CREDENTIAL_PROVIDERS: dict[str, Any] = {}


def connection_options(url: str, kwargs: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """``(url, kwargs)`` for redis-py with this project's explicit choices.

    RESP2 always: ``protocol=`` anything else in the URL or the arguments is a ConfigError
    (redis-py lets URL options override arguments, so the URL's own is removed).  Defaults an
    argument or the URL overrides: ``socket_keepalive=True``, ``socket_connect_timeout``
    (:data:`CONNECT_TIMEOUT_SECS`), ``socket_timeout`` (:func:`read_timeout`; a client with
    blocking reads passes a longer one) and, for ``rediss://``, certificate and hostname
    verification (``ssl_cert_reqs=required``, ``ssl_check_hostname=True``: redis-py 5 leaves
    the hostname unchecked by default), and the URL's registered ``credential_provider``
    (``credentials.py``).  Pure: the drivers add redis-py's own objects.
    """
    check_url(url)
    out = dict(kwargs)
    provider = CREDENTIAL_PROVIDERS.get(url)
    if provider is not None:
        out.setdefault("credential_provider", provider)
    if "protocol" in out and str(out["protocol"]) != str(PROTOCOL):
        raise ConfigError(f"protocol={out['protocol']!r}: Chasqui speaks RESP2 only (protocol=2)")
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = {name.lower(): value for name, value in query}
    if "protocol" in options:
        if options["protocol"].strip() != str(PROTOCOL):
            raise ConfigError(
                f"protocol={options['protocol']!r} in the Redis URL: Chasqui speaks RESP2 only (protocol=2)"
            )
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
