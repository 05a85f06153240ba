"""The filters ``spark.read.format("chasqui")`` can use while reading (``pushFilters``): time
ranges and ``name`` / ``event`` sets folded into a :class:`Pushed`, the rest handed back to
Spark.  The reader (``reader.py``) narrows its XRANGE bounds or score range with the time range
and drops rows by name and kind before building them.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
)

__all__ = ["NO_FILTERS", "Pushed", "push"]


@dataclass(frozen=True)
class Pushed:
    """What the pushed filters leave to read: an inclusive millisecond range of the time column,
    and the names (and event kinds) a row must have; ``None`` = no constraint."""

    lo_ms: int | None = None
    hi_ms: int | None = None
    names: frozenset[str] | None = None
    kinds: frozenset[str] | None = None

    def empty(self) -> bool:
        return (
            (self.lo_ms is not None and self.hi_ms is not None and self.lo_ms > self.hi_ms)
            or self.names == frozenset()
            or self.kinds == frozenset()
        )

    def keeps(self, name: Any, kind: Any = None) -> bool:
        return (self.names is None or name in self.names) and (self.kinds is None or kind in self.kinds)


NO_FILTERS = Pushed()  # a read nothing was pushed into


_TIME_COL = {"events": "ts", "dlq": "ts", "results": "stored_at"}
_NAME_COL = {"events": "name", "dlq": "name", "repeatable": "name"}


def _us(value: Any) -> int | None:
    """A filter's timestamp value as microseconds since the epoch (naive = UTC, as Spark sends
    TIMESTAMP values), or None for anything else."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.UTC)
        delta = value - _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
        us: int = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
        return us
    return None


def _strings(values: Any) -> frozenset[str] | None:
    if not all(v is None or isinstance(v, str) for v in values):
        return None
    return frozenset(v for v in values if v is not None)  # NULL never equals: such rows are not kept


def _and(a: frozenset[str] | None, b: frozenset[str]) -> frozenset[str]:
    return b if a is None else a & b


def push(what: str, filters: list[Filter], pushed: Pushed) -> tuple[Pushed, list[Filter]]:
    """Fold the filters this source can use into ``pushed``; return it and the filters Spark
    must still apply (by reference, as ``pushFilters`` requires)."""
    lo, hi, names, kinds = pushed.lo_ms, pushed.hi_ms, pushed.names, pushed.kinds
    left: list[Filter] = []
    time_col, name_col = _TIME_COL.get(what), _NAME_COL.get(what)
    for f in filters:
        col = getattr(f, "attribute", None)
        col = col[0] if isinstance(col, tuple) and len(col) == 1 else None
        value = getattr(f, "value", None)
        if col is not None and col == time_col and _us(value) is not None:
            us = _us(value)
            assert us is not None
            # a row's time is a whole millisecond m: compare m * 1000 with the value in microseconds
            if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo, EqualNullSafe)):
                low = us // 1000 + 1 if isinstance(f, GreaterThan) else -(-us // 1000)
                lo = low if lo is None else max(lo, low)
            if isinstance(f, (LessThan, LessThanOrEqual, EqualTo, EqualNullSafe)):
                high = -(-us // 1000) - 1 if isinstance(f, LessThan) else us // 1000
                hi = high if hi is None else min(hi, high)
            if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo, EqualNullSafe, LessThan, LessThanOrEqual)):
                if what == "events":
                    left.append(f)  # the bounds were widened: Spark checks each row's ts
                continue
        if col is not None and col in (name_col, "event" if what == "events" else None):
            got = None
            if isinstance(f, (EqualTo, EqualNullSafe)) and isinstance(value, str):
                got = frozenset([value])
            elif isinstance(f, In):
                got = _strings(value)
            if got is not None:
                if col == "event":
                    kinds = _and(kinds, got)
                else:
                    names = _and(names, got)
                continue
        left.append(f)
    return Pushed(lo, hi, names, kinds), left
