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
