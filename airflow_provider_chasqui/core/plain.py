"""Values from Spark (or anywhere) as something msgpack encodes: the rules a DataFrame row's
values follow on their way into a job payload or a job result (no pyspark import).

``Decimal`` -> ``str`` (exact), ``date``/``datetime``/``time`` -> ISO 8601 ``str``, a
``pyspark.sql.Row`` (a tuple with ``asDict``) or a mapping -> ``dict``, ``bytearray`` ->
``bytes``, lists and tuples recursively; anything else is a ``ConfigError``.
"""

from __future__ import annotations

import datetime as _dt
import decimal
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError

__all__ = ["to_plain"]

_SIMPLE = frozenset((str, int, float, bool, type(None), bytes))


def to_plain(value: Any) -> Any:
    """A Spark value as something msgpack encodes (see the module docstring for the rules)."""
    cls = value.__class__
    if cls in _SIMPLE:
        return value
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, bytearray):
        return bytes(value)
    if hasattr(value, "asDict") and isinstance(value, tuple):  # pyspark.sql.Row
        return {k: to_plain(v) for k, v in value.asDict(recursive=False).items()}  # type: ignore[attr-defined]
    if isinstance(value, Mapping):
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, (str, int, float)):  # subclasses (numpy scalars are not)
        return value
    raise ConfigError(f"a {cls.__name__} value cannot be put in a job payload")
