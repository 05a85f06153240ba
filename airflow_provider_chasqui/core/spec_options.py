"""A repeatable spec's options as users pass them, checked and normalised before anything is
written: the pattern (``RepeatPattern``, chasquimq's, or a dict; cron expressions and zones
compiled once), the missed-fires policy (an object, a dict or a name), instants (a datetime,
naive = UTC, or epoch ms), a deadline, a fire limit and ``while_paused``.  Every bad value is
a ``ConfigError`` naming the option.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import ConfigError
from .codec import U64_MAX  # the largest instant, deadline or count a spec stores
from .cron import check_cron
from .repeat import MissedFiresPolicy, RepeatPattern

__all__ = [
    "coerce_pattern",
    "coerce_policy",
    "epoch_ms",
    "one_of",
    "skip_while_paused",
    "deadline_ms",
    "spec_limit",
    "SKIP",
    "check_spec_key",
]

SKIP = MissedFiresPolicy.skip()


def coerce_pattern(repeat: Any) -> RepeatPattern:
    """A ``RepeatPattern`` (ours or chasquimq's) or its dict form, validated (cron and zone)."""
    if type(repeat) is RepeatPattern and repeat in _VALIDATED:
        return repeat
    if repeat is None:
        raise ConfigError("repeat is required: RepeatPattern.cron(expr, tz=...) or RepeatPattern.every(ms)")
    if isinstance(repeat, Mapping):
        kind = repeat.get("kind")
        if kind == "cron":
            unknown = set(repeat) - {"kind", "expression", "pattern", "tz"}
            expr = repeat.get("expression", repeat.get("pattern"))
            pattern = RepeatPattern(kind="cron", expression=expr, tz=repeat.get("tz"))
        elif kind == "every":
            unknown = set(repeat) - {"kind", "interval_ms", "every"}
            pattern = RepeatPattern(kind="every", interval_ms=repeat.get("interval_ms", repeat.get("every")))
        else:
            raise ConfigError(f"repeat dict must have kind 'cron' or 'every', got {kind!r}")
        if unknown:
            raise ConfigError(f"unknown repeat keys {sorted(unknown)}")
    elif isinstance(repeat, RepeatPattern):
        pattern = repeat
    elif hasattr(repeat, "kind"):  # chasquimq.RepeatPattern and look-alikes
        if repeat.kind == "cron":
            pattern = RepeatPattern(kind="cron", expression=repeat.expression, tz=getattr(repeat, "tz", None))
        else:
            pattern = RepeatPattern(kind=repeat.kind, interval_ms=getattr(repeat, "interval_ms", None))
    else:
        raise ConfigError(f"repeat must be a RepeatPattern or a dict, got {type(repeat).__name__}")
    if pattern.kind == "cron":
        check_cron(pattern.expression, pattern.tz)  # type: ignore[arg-type]
    if len(_VALIDATED) > 4096:
        _VALIDATED.clear()
    _VALIDATED.add(pattern)
    return pattern


_VALIDATED: set[RepeatPattern] = set()  # patterns already checked (bulk upserts share a few)

_POLICY_NAMES = {
    "skip": "skip",
    "fire-once": "fire-once",
    "fire_once": "fire-once",
    "fire-all": "fire-all",
    "fire_all": "fire-all",
}


def coerce_policy(value: Any) -> MissedFiresPolicy:
    """A ``MissedFiresPolicy`` (ours or chasquimq's), its dict form, a name, or None (= skip)."""
    if value is None:
        return SKIP
    if isinstance(value, MissedFiresPolicy):
        return value
    if isinstance(value, str):
        kind, cap = _POLICY_NAMES.get(value.lower()), None
        if kind == "fire-all":
            raise ConfigError("fire-all needs max_catchup: MissedFiresPolicy.fire_all(n)")
    elif isinstance(value, Mapping):
        raw = value.get("kind")
        kind = _POLICY_NAMES.get(raw.lower()) if isinstance(raw, str) else None
        cap = value.get("max_catchup", 100 if kind == "fire-all" else None)  # the native binding's default
    elif hasattr(value, "kind"):
        kind, cap = _POLICY_NAMES.get(str(value.kind).lower()), getattr(value, "max_catchup", None)
    else:
        raise ConfigError(f"missed_fires must be a MissedFiresPolicy, dict or name, got {type(value).__name__}")
    if kind is None:
        raise ConfigError(f"unknown missed_fires policy {value!r}; expected skip, fire-once or fire-all")
    return MissedFiresPolicy(kind=kind, max_catchup=cap if kind == "fire-all" else None)


def epoch_ms(value: Any, what: str) -> int | None:
    """datetime (naive = UTC) or epoch milliseconds."""
    if value is None:
        return None
    if isinstance(value, datetime):
        when = value if value.tzinfo else value.replace(tzinfo=UTC)
        ms = math.floor(when.timestamp() * 1000)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a datetime or epoch milliseconds, got {type(value).__name__}")
    elif not math.isfinite(value):
        raise ConfigError(f"{what} must be finite, got {value!r}")
    else:
        ms = int(value)
    if not 0 <= ms <= U64_MAX:
        raise ConfigError(f"{what} must be at or after the epoch, got {value!r}")
    return ms


def one_of(a: Any, b: Any, what: str) -> Any:
    if a is not None and b is not None:
        raise ConfigError(f"pass either {what} or {what}_ms, not both")
    return a if a is not None else b


def skip_while_paused(value: Any) -> bool:
    """``while_paused``: "queue" (None, the default: fires due while the queue is paused are
    queued and run after the resume) or "skip" (they are skipped and counted)."""
    if value is None or value == "queue":
        return False
    if value == "skip":
        return True
    raise ConfigError(f"while_paused must be 'queue' or 'skip', got {value!r}")


def deadline_ms(value: Any) -> int | None:
    """timedelta, or milliseconds."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1000
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"deadline must be a timedelta or milliseconds, got {type(value).__name__}")
    else:
        ms = float(value)
    if not math.isfinite(ms) or ms < 1:
        raise ConfigError(f"deadline must be at least 1 ms, got {value!r}")
    if ms > U64_MAX:  # the spec stores it as a u64: msgpack's OverflowError before
        raise ConfigError(f"deadline must be at most 2**64 - 1 ms, got {value!r}")
    return int(ms)


def spec_limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= U64_MAX:
        raise ConfigError(f"limit must be a positive int (the number of fires) or None, got {value!r}")
    return value


def check_spec_key(key: Any) -> str:
    """A spec key as the methods that take one need it (a ``ConfigError`` otherwise)."""
    if not isinstance(key, str) or not key:
        raise ConfigError(f"spec key must be a non-empty str, got {key!r}")
    return key
