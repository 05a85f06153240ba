"""Repeatable-spec value types, the ``StoredSpec`` wire codec and missed-fire planning.

Holds ``RepeatPattern`` / ``MissedFiresPolicy`` / ``RepeatableMeta`` (the chasquimq 1.3 value
API), ``StoredSpec`` (spec §8.3, byte-exact with test vectors V10-V12), the spec-key rule
(§8.2) and ``plan_fires`` (§15.4).  Imports only the standard library, ``msgpack`` and
``croniter`` (through :mod:`.cron`); no redis.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgpack

from ..errors import CodecError, ConfigError
from .codec import U32_MAX, U64_MAX
from .cron import check_cron, first_fire_after_now, next_fire_after

__all__ = [
    "RepeatPattern",
    "MissedFiresPolicy",
    "RepeatableMeta",
    "StoredSpec",
    "derive_spec_key",
    "plan_fires",
    "pattern_to_wire",
    "pattern_from_wire",
    "policy_to_wire",
    "policy_from_wire",
    "FIRE_ALL_LIST_CAP",
    "catchup_fires",
    "catchup_next",
]

FIRE_ALL_LIST_CAP = 10_000
"""FireAll never dispatches more than this many fires in one tick."""

_T = TypeVar("_T")


def _is_uint(value: object, top: int = U64_MAX) -> bool:
    return type(value) is int and 0 <= value <= top  # bool is rejected by the type check


def _check_uint(name: str, value: object, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if not _is_uint(value):
        raise ConfigError(f"{name} must be an int in 0..2**64-1 or None, got {value!r}")


# --------------------------------------------------------------------------- value types


@dataclass(frozen=True, slots=True)
class RepeatPattern:
    """A schedule: ``RepeatPattern.cron(expr, tz=...)`` or ``RepeatPattern.every(ms)``."""

    kind: str
    expression: str | None = None
    tz: str | None = None
    interval_ms: int | None = None

    def __post_init__(self) -> None:
        if self.kind == "every":
            if type(self.interval_ms) is not int or not 0 < self.interval_ms <= U64_MAX:
                raise ConfigError(f"every interval_ms must be an int from 1 to 2**64 - 1, got {self.interval_ms!r}")
            if self.expression is not None or self.tz is not None:
                raise ConfigError("an every pattern takes no expression or tz")
        elif self.kind == "cron":
            if not isinstance(self.expression, str) or not self.expression.strip():
                raise ConfigError(f"invalid cron expression {self.expression!r}: must be a non-empty str")
            if self.tz is not None and not isinstance(self.tz, str):
                raise ConfigError(f"tz must be a str or None, got {type(self.tz).__name__}")
            if self.interval_ms is not None:
                raise ConfigError("a cron pattern takes no interval_ms")
        else:
            raise ConfigError(f"unknown RepeatPattern kind {self.kind!r} (expected 'cron' or 'every')")

    @staticmethod
    def cron(expression: str, *, tz: str | None = None) -> RepeatPattern:
        """5-field or 6-field (leading seconds) cron in ``tz`` (UTC, ±HH:MM or IANA); validated now."""
        pattern = RepeatPattern(kind="cron", expression=expression, tz=tz)
        check_cron(expression, tz)
        return pattern

    @staticmethod
    def every(interval_ms: int) -> RepeatPattern:
        """Fixed interval; the first fire is one interval after upsert (or ``start_after_ms``)."""
        return RepeatPattern(kind="every", interval_ms=interval_ms)

    def to_dict(self) -> dict[str, Any]:
        """The chasquimq FFI dict (``{"kind": "cron", ...}``); never written to Redis."""
        if self.kind == "every":
            return {"kind": "every", "interval_ms": self.interval_ms}
        out: dict[str, Any] = {"kind": "cron", "expression": self.expression}
        if self.tz is not None:
            out["tz"] = self.tz
        return out


@dataclass(frozen=True, slots=True)
class MissedFiresPolicy:
    """What a late scheduler does with elapsed windows: skip (default), fire once or fire all."""

    kind: str
    max_catchup: int | None = None

    def __post_init__(self) -> None:
        if self.kind == "fire-all":
            if not _is_uint(self.max_catchup, U32_MAX):
                raise ConfigError(f"max_catchup must be non-negative, an int in 0..2**32-1, got {self.max_catchup!r}")
        elif self.kind in ("skip", "fire-once"):
            if self.max_catchup is not None:
                raise ConfigError(f"{self.kind} takes no max_catchup")
        else:
            raise ConfigError(f"unknown MissedFiresPolicy kind {self.kind!r}")

    @staticmethod
    def skip() -> MissedFiresPolicy:
        """Drop missed windows; resume at the first future instant (default)."""
        return MissedFiresPolicy(kind="skip")

    @staticmethod
    def fire_once() -> MissedFiresPolicy:
        """One fire stands for all missed windows, then resume."""
        return MissedFiresPolicy(kind="fire-once")

    @staticmethod
    def fire_all(max_catchup: int) -> MissedFiresPolicy:
        """Replay each missed window, at most ``max_catchup`` per tick (0: none, as ``skip``;
        chasquimq takes any u32, and a ChasquiMQ producer may store it)."""
        return MissedFiresPolicy(kind="fire-all", max_catchup=max_catchup)

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "fire-all":
            return {"kind": "fire-all", "max_catchup": self.max_catchup}
        return {"kind": self.kind}


_SKIP = MissedFiresPolicy.skip()


@dataclass(frozen=True, slots=True)
class RepeatableMeta:
    """Listing projection of a spec (no payload), as chasquimq's ``get_repeatable_jobs``."""

    key: str
    job_name: str
    pattern: RepeatPattern
    next_fire_ms: int
    limit: int | None = None
    start_after_ms: int | None = None
    end_before_ms: int | None = None
    missed_fires: MissedFiresPolicy | None = None


# --------------------------------------------------------------------------- wire pieces


def pattern_to_wire(pattern: RepeatPattern) -> dict[str, list[Any]]:
    """rmp-serde externally tagged form: ``{"Cron": [expr, tz]}`` / ``{"Every": [ms]}``."""
    if pattern.kind == "cron":
        return {"Cron": [pattern.expression, pattern.tz]}
    return {"Every": [pattern.interval_ms]}


def _variant(obj: object, what: str) -> tuple[str, Any]:
    if isinstance(obj, str):
        return obj, None
    if not isinstance(obj, dict) or len(obj) != 1:
        raise CodecError(f"{what} must be a variant name or a 1-entry map, got {obj!r}")
    ((name, body),) = obj.items()
    if not isinstance(name, str):
        raise CodecError(f"{what} variant name must be a str, got {name!r}")
    return name, body


def _fields(body: object, n: int, what: str) -> list[Any]:
    if not isinstance(body, list) or len(body) != n:
        raise CodecError(f"{what} must carry an array of {n} field(s), got {body!r}")
    return body


def pattern_from_wire(obj: object) -> RepeatPattern:
    """Inverse of :func:`pattern_to_wire`; the cron text itself is checked only when used."""
    name, body = _variant(obj, "pattern")
    if name == "Cron":
        expr, tz = _fields(body, 2, "Cron")
        if not isinstance(expr, str) or not (tz is None or isinstance(tz, str)):
            raise CodecError(f"Cron fields must be [str, str|nil], got {body!r}")
        return _build(RepeatPattern, "pattern", kind="cron", expression=expr, tz=tz)
    if name == "Every":
        (interval,) = _fields(body, 1, "Every")
        if not _is_uint(interval):
            raise CodecError(f"Every interval_ms must be a uint64, got {interval!r}")
        return _build(RepeatPattern, "pattern", kind="every", interval_ms=interval)
    raise CodecError(f"unknown pattern variant {name!r}")


def policy_to_wire(policy: MissedFiresPolicy) -> str | dict[str, list[int]]:
    """``"Skip"`` / ``"FireOnce"`` / ``{"FireAll": [max_catchup]}``."""
    if policy.kind == "fire-all":
        return {"FireAll": [policy.max_catchup]}  # type: ignore[list-item]
    return "FireOnce" if policy.kind == "fire-once" else "Skip"


def policy_from_wire(obj: object) -> MissedFiresPolicy:
    name, body = _variant(obj, "missed_fires")
    if name in ("Skip", "FireOnce"):
        if body is not None:
            raise CodecError(f"{name} carries no data, got {body!r}")
        return MissedFiresPolicy.skip() if name == "Skip" else MissedFiresPolicy.fire_once()
    if name == "FireAll":
        (cap,) = _fields(body, 1, "FireAll")
        if not _is_uint(cap, U32_MAX):
            raise CodecError(f"FireAll max_catchup must be a uint32, got {cap!r}")
        return _build(MissedFiresPolicy, "missed_fires", kind="fire-all", max_catchup=cap)
    raise CodecError(f"unknown missed_fires variant {name!r}")


def _build(cls: type[_T], what: str, **kwargs: Any) -> _T:
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise CodecError(f"invalid {what}: {exc}") from exc


def _unwrap_raw_bytes(payload: object) -> bytes:
    """The stored payload is ``rmp_serde(RawBytes(inner))`` = a msgpack bin holding ``inner``."""
    if not isinstance(payload, bytes):
        raise CodecError(f"payload must be a msgpack bin, got {type(payload).__name__}")
    inner = _unpack(payload, "payload")
    if isinstance(inner, bytes):
        return inner
    if isinstance(inner, list) and all(_is_uint(b, 255) for b in inner):
        return bytes(inner)
    raise CodecError(f"payload must hold a msgpack bin (RawBytes), got {type(inner).__name__}")


def _unpack(data: object, what: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise CodecError(f"{what} is not valid msgpack: {exc!r}") from exc


# --------------------------------------------------------------------------- StoredSpec


@dataclass(frozen=True, slots=True)
class StoredSpec:
    """The ``spec`` field of ``{chasqui:<q>}:repeat:spec:<key>`` (spec §8.3).

    ``payload_inner`` is the user-data msgpack (what ``Queue.add`` packs); on the wire it
    becomes bin(bin(inner)).  The ``fired`` slot is always written as 0 and ignored on decode.
    """

    key: str
    job_name: str
    pattern: RepeatPattern
    payload_inner: bytes
    limit: int | None = None
    start_after_ms: int | None = None
    end_before_ms: int | None = None
    missed_fires: MissedFiresPolicy = field(default=_SKIP)

    def __post_init__(self) -> None:
        if not isinstance(self.key, str) or not isinstance(self.job_name, str):
            raise ConfigError("key and job_name must be str")
        if not isinstance(self.pattern, RepeatPattern):
            raise ConfigError(f"pattern must be a RepeatPattern, got {type(self.pattern).__name__}")
        if not isinstance(self.payload_inner, bytes):
            raise ConfigError(f"payload_inner must be bytes, got {type(self.payload_inner).__name__}")
        if not isinstance(self.missed_fires, MissedFiresPolicy):
            raise ConfigError("missed_fires must be a MissedFiresPolicy")
        for name in ("limit", "start_after_ms", "end_before_ms"):
            _check_uint(name, getattr(self, name))

    def encode(self) -> bytes:
        """Compact array of 8 (9 when the policy is not Skip), exactly as rmp-serde writes it."""
        items: list[Any] = [
            self.key,
            self.job_name,
            pattern_to_wire(self.pattern),
            msgpack.packb(self.payload_inner, use_bin_type=True),
            self.limit,
            self.start_after_ms,
            self.end_before_ms,
            0,
        ]
        if self.missed_fires.kind != "skip":
            items.append(policy_to_wire(self.missed_fires))
        packed: bytes = msgpack.packb(items, use_bin_type=True)
        return packed

    @classmethod
    def decode(cls, data: bytes) -> StoredSpec:
        """Parse stored bytes; CodecError (with the reason) when they are not a StoredSpec."""
        arr = _unpack(data, "stored spec")
        if not isinstance(arr, list) or len(arr) not in (8, 9):
            size = len(arr) if isinstance(arr, list) else type(arr).__name__
            raise CodecError(f"stored spec must be an array of 8 or 9 elements, got {size}")
        key, job_name, pattern, payload, limit, start_after, end_before, fired = arr[:8]
        if not isinstance(key, str) or not isinstance(job_name, str):
            raise CodecError("stored spec key and job_name must be str")
        for name, value in (("limit", limit), ("start_after_ms", start_after), ("end_before_ms", end_before)):
            if value is not None and not _is_uint(value):
                raise CodecError(f"stored spec {name} must be a uint64 or nil, got {value!r}")
        if not _is_uint(fired):
            raise CodecError(f"stored spec fired must be a uint64, got {fired!r}")
        policy = policy_from_wire(arr[8]) if len(arr) == 9 else _SKIP
        return cls(
            key,
            job_name,
            pattern_from_wire(pattern),
            _unwrap_raw_bytes(payload),
            limit,
            start_after,
            end_before,
            policy,
        )

    def to_meta(self, next_fire_ms: int) -> RepeatableMeta:
        """Listing projection with the ZSET score as ``next_fire_ms``."""
        return RepeatableMeta(
            self.key,
            self.job_name,
            self.pattern,
            next_fire_ms,
            self.limit,
            self.start_after_ms,
            self.end_before_ms,
            self.missed_fires,
        )


# --------------------------------------------------------------------------- keys & fires


def derive_spec_key(job_name: str, pattern: RepeatPattern, key: str | None = None) -> str:
    """Spec §8.2: a non-empty caller key wins, else ``<job>::cron:<expr>:<tz|UTC>`` / ``::every:<ms>``."""
    if key is not None and not isinstance(key, str):
        raise ConfigError(f"key must be a str or None, got {type(key).__name__}")
    if key:
        return key
    if not isinstance(job_name, str):
        raise ConfigError(f"job_name must be a str, got {type(job_name).__name__}")
    if pattern.kind == "cron":
        tz = "UTC" if pattern.tz is None else pattern.tz
        return f"{job_name}::cron:{pattern.expression}:{tz}"
    return f"{job_name}::every:{pattern.interval_ms}"


def plan_fires(
    pattern: RepeatPattern,
    fire_at_ms: int,
    now_ms: int,
    start_after_ms: int | None,
    policy: MissedFiresPolicy,
) -> tuple[list[int], int]:
    """Spec §15.4: the fire instants to dispatch now and the next score (0 = remove the spec)."""
    cadence = next_fire_after(pattern, fire_at_ms, start_after_ms)
    if cadence is not None and cadence >= now_ms:
        return [fire_at_ms], cadence
    if policy.kind == "skip":
        return [], first_fire_after_now(pattern, fire_at_ms, now_ms, start_after_ms)
    if policy.kind == "fire-once":
        return [fire_at_ms], first_fire_after_now(pattern, fire_at_ms, now_ms, start_after_ms)
    return _fire_all(pattern, fire_at_ms, now_ms, start_after_ms, policy.max_catchup or 0)


def _fire_all(
    pattern: RepeatPattern, fire_at: int, now: int, start_after: int | None, max_catchup: int
) -> tuple[list[int], int]:
    # the backlog is capped at the list cap: the windows past it would be walked only to
    # find the cursor, and either way the spec resumes at its first instant after now
    fires, cursor = catchup_fires(pattern, fire_at, now, start_after, min(max_catchup, FIRE_ALL_LIST_CAP))
    return fires, catchup_next(pattern, cursor, now, start_after)


def catchup_fires(
    pattern: RepeatPattern, cursor: int, now: int, start_after: int | None, n: int
) -> tuple[list[int], int | None]:
    """Up to ``n`` windows of a fire-all backlog from ``cursor`` (a window of the timeline)
    up to ``now``, and the window after them (None: the pattern has no more).  Resumable:
    the returned cursor continues the same walk, so a backlog can be planned a piece at a
    time (the scheduler does, to bound the work between two yields of its event loop)."""
    if pattern.kind == "every" and pattern.interval_ms:
        return _every_catchup(pattern.interval_ms, cursor, now, start_after, n)
    return _walk_catchup(pattern, cursor, now, start_after, n)


def catchup_next(pattern: RepeatPattern, cursor: int | None, now: int, start_after: int | None) -> int:
    """The score a fire-all spec gets once its catch-up stopped at ``cursor``: the cursor
    when it is past now, else (the cap was reached) the first instant after now; 0 = none."""
    if cursor is None:
        return 0
    if cursor > now:
        return cursor
    return first_fire_after_now(pattern, cursor, now, start_after)


def _walk_catchup(
    pattern: RepeatPattern, at: int, now: int, start_after: int | None, max_catchup: int
) -> tuple[list[int], int | None]:
    fires: list[int] = []
    count = 0
    cursor: int | None = at
    while cursor is not None and cursor <= now and count < max_catchup:
        fires.append(cursor)
        count += 1
        cursor = next_fire_after(pattern, cursor, start_after)
    return fires, cursor


def _every_catchup(
    interval: int, at: int, now: int, start_after: int | None, max_catchup: int
) -> tuple[list[int], int]:
    """Closed form of :func:`_walk_catchup` for intervals: at, a1, a1+i, a1+2i, ..."""
    first = max(at, start_after or 0) + interval

    def nth(k: int) -> int:
        return at if k == 0 else first + (k - 1) * interval

    due = 0 if at > now else 1 + (0 if first > now else (now - first) // interval + 1)
    count = min(due, max_catchup)
    return [nth(k) for k in range(count)], nth(count)
