"""Repeatable-spec CRUD as flows: every decision of the ``*_repeatable*`` methods of ``Queue``
and ``SyncQueue`` (and their sharded forms) lives here.

Storage is ChasquiMQ's (wire spec §8): ZSET ``repeat`` (member = spec key, score = next fire
ms) and one HASH ``repeat:spec:<key>`` per spec with the ``spec`` field (``StoredSpec``) and
the ``fired`` counter.  This project adds no per-spec keys, only:

* the optional hash field ``ext``: msgpack ``[1, retry_override|nil, deadline_ms|nil]``, the
  per-spec retry override (applied to every fire; ChasquiMQ ignores the field) and the
  execution deadline (a fire later than that past its scheduled time is skipped and counted
  in the hash field ``skipped``), with a fourth item ``1`` for ``while_paused="skip"`` (``0``
  otherwise when a fifth follows: every fire's own ``timeout_ms``) (a fire
  due while the queue is paused is skipped and counted the same way; issue 24), and a sixth
  and seventh, every fire's ``priority`` and ``group`` (nil when unset): such a spec's fires
  wait beside the stream as the jobs added with them do (``lua/schedule_batch.lua``'s op 'S'),
  and an eighth, ``[dedup_id, mode, ttl_ms]``: every fire is added as ``add(dedup_id=...)``
  adds (``core/dedup.py``; op 'U'), sharing the marker with every other producer of that id;
* the ZSET ``repeat:paused`` (score = the next fire when paused): a paused spec is not in
  ``repeat``, so no scheduler, not even a ChasquiMQ one sharing the queue, can fire it;
* the HASH ``repeat:quarantine`` (spec key -> raw bytes of a stored spec that did not decode).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, NamedTuple

import msgpack

from ..errors import CodecError, ConfigError
from .backoff import BackoffSpec, build_retry_override
from .calls import Call, Flow, Stream, command, int_reply, script_call, str_reply
from .codec import (
    Envelope,
    RetryOverride,
    decode_data,
    encode_data,
    encode_envelope,
    new_job_id,
    now_ms,
    validate_job_name,
)
from .cron import compile_cron, first_fire_after_now, next_fire_after
from .keys import QueueKeys
from .repeat import (
    MissedFiresPolicy,
    RepeatableMeta,
    RepeatPattern,
    StoredSpec,
    derive_spec_key,
    pattern_to_wire,
    policy_to_wire,
)
from .running import check_timeout_ms, mark_timeouts
from .settings import QueueSettings
from .spec_ext import SpecExt, dedup_option, side_options

__all__ = [
    "spec_row",
    "RepeatableInfo",
    "CorruptSpec",
    "PreparedSpec",
    "SpecFlows",
    "coerce_pattern",
    "show_key",
    "coerce_policy",
    "bulk_spec_key",
    "spec_key_arg",
    "UPSERT_CHUNK",
    "REPEAT_BULK_KEYS",
]

UPSERT_CHUNK = 1000
MAX_PAGE = 10_000
REPEAT_BULK_KEYS = frozenset(
    {
        "name",
        "data",
        "repeat",
        "key",
        "limit",
        "start_after",
        "end_before",
        "start_after_ms",
        "end_before_ms",
        "missed_fires",
        "attempts",
        "backoff",
        "deadline",
        "while_paused",
        "job_id",
        "timeout_ms",
        "priority",
        "group",
        "dedup_id",
        "dedup_mode",
        "dedup_ttl_ms",
    }
)
_U64 = 2**64 - 1
_packb: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True, autoreset=True).pack


_SKIP = MissedFiresPolicy.skip()


# --------------------------------------------------------------------------- listing type


@dataclass(frozen=True, slots=True)
class RepeatableInfo(RepeatableMeta):
    """Everything about one spec: the chasquimq ``RepeatableMeta`` fields plus this project's.

    ``next_fire_ms`` is the score: the next fire, or for a paused spec the next fire it had
    when paused.  ``data`` is the decoded payload every fire carries.
    """

    paused: bool = False
    fired: int = 0
    skipped: int = 0
    data: Any = None
    attempts: int | None = None
    backoff: BackoffSpec | None = None
    deadline_ms: int | None = None
    while_paused: str = "queue"  # or "skip": what a fire due while the queue is paused does
    timeout_ms: int | None = None  # every fire's own timeout
    priority: int | None = None  # every fire's priority
    group: str | None = None  # every fire's group
    dedup_id: str | None = None  # every fire's deduplication id, mode and window
    dedup_mode: str | None = None
    dedup_ttl_ms: int | None = None
    corrupt: ClassVar[bool] = False


@dataclass(frozen=True, slots=True)
class CorruptSpec:
    """A listed spec that cannot be read (``list_repeatable`` shows it instead of failing):
    ``key`` with bytes that are not UTF-8 escaped (``raw_key`` holds them), the score as
    Redis stores it (``score``, e.g. ``"inf"``), and ``reason``.  The scheduler moves such
    a spec to the quarantine hash when it cannot fire it; ``remove_repeatable_by_key``
    deletes one whose key is UTF-8."""

    key: str
    raw_key: bytes
    paused: bool
    score: str
    reason: str
    corrupt: ClassVar[bool] = True


class PreparedSpec(NamedTuple):
    """A validated, encoded spec: what one upsert writes."""

    key: str
    next_fire_ms: int
    spec: bytes
    ext: bytes = b""


# --------------------------------------------------------------------------- coercion


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
        compile_cron(pattern.expression, pattern.tz)  # type: ignore[arg-type]
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
        return _SKIP
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


def _epoch_ms(value: Any, what: str) -> int | None:
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
    if not 0 <= ms <= _U64:
        raise ConfigError(f"{what} must be at or after the epoch, got {value!r}")
    return ms


def _one_of(a: Any, b: Any, what: str) -> Any:
    if a is not None and b is not None:
        raise ConfigError(f"pass either {what} or {what}_ms, not both")
    return a if a is not None else b


def _skip_while_paused(value: Any) -> bool:
    """``while_paused``: "queue" (None, the default: fires due while the queue is paused are
    queued and run after the resume) or "skip" (they are skipped and counted)."""
    if value is None or value == "queue":
        return False
    if value == "skip":
        return True
    raise ConfigError(f"while_paused must be 'queue' or 'skip', got {value!r}")


def _deadline_ms(value: Any) -> int | None:
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
    return int(ms)


def _limit(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= _U64:
        raise ConfigError(f"limit must be a positive int (the number of fires) or None, got {value!r}")
    return value


def _encode_spec(
    key: str,
    name: str,
    pattern: RepeatPattern,
    inner: bytes,
    limit: int | None,
    start: int | None,
    end: int | None,
    policy: MissedFiresPolicy,
) -> bytes:
    """``StoredSpec(...).encode()`` for already validated fields (the bulk path's hot loop);
    a test checks both give the same bytes."""
    items = [key, name, pattern_to_wire(pattern), _packb(inner), limit, start, end, 0]
    if policy.kind != "skip":
        items.append(policy_to_wire(policy))
    return _packb(items)


_FAST_KEYS = frozenset({"name", "data", "repeat", "key"})
_BIN8 = [bytes((0xC4, n)) for n in range(256)]  # msgpack bin8 headers
_SPEC_TAIL = b"\xc0\xc0\xc0\x00"  # limit, start_after, end_before = nil; fired = 0


def _fast_pattern(pattern: RepeatPattern, now: int) -> tuple[int, Any, str]:
    """(first fire after now, wire form, derived key suffix) of a pattern, validated."""
    coerce_pattern(pattern)
    nxt = next_fire_after(pattern, now, None)
    if nxt is None:
        raise ConfigError(f"repeat pattern {_describe(pattern)} has no future fire")
    return nxt, pattern_to_wire(pattern), derive_spec_key("", pattern)


def spec_key_arg(key: Any, job_id: Any) -> Any:
    """The caller's name for a spec: ``key``, or ``job_id`` (a repeatable spec's id is its key;
    what chasquimq 1.3 accepts and drops); both, with different values, is a ConfigError."""
    if job_id is None:
        return key
    if not isinstance(job_id, str) or not job_id:
        raise ConfigError(f"job_id of a repeatable spec is its key: a non-empty str, got {job_id!r}")
    if key is not None and key != job_id:
        raise ConfigError(
            f"job_id {job_id!r} and key {key!r} both name the spec (a repeatable spec's id is its key): "
            "pass one of them"
        )
    return job_id


def bulk_spec_key(item: Mapping[str, Any]) -> str:
    """The key an ``upsert_repeatable_bulk`` item resolves to (for routing to a shard)."""
    _check_item(item)
    return sharded_spec_key(item["name"], item.get("repeat"), item.get("key"), item)


def sharded_spec_key(name: str, repeat: Any, key: str | None, options: Mapping[str, Any]) -> str:
    """The key that routes a spec to its shard.  A spec of a sharded queue cannot take a
    ``group``: a group lives on the shard its name picks, the spec on its key's."""
    if options.get("group") is not None:
        raise ConfigError(
            "a repeatable spec of a sharded queue cannot take a group (a group lives on one shard, a spec on "
            "its key's): give it a priority, or upsert it on the group's shard (shard_for(group))"
        )
    return derive_spec_key(name, coerce_pattern(repeat), spec_key_arg(key, options.get("job_id")))


def _check_item(item: Any) -> None:
    if type(item) is not dict and not isinstance(item, Mapping):
        raise ConfigError(f"upsert_repeatable_bulk items must be dicts, got {type(item).__name__}")
    unknown = item.keys() - REPEAT_BULK_KEYS
    if unknown:
        raise ConfigError(f"unknown upsert_repeatable_bulk keys {sorted(unknown)}; allowed: {sorted(REPEAT_BULK_KEYS)}")
    for required in ("name", "repeat"):
        if item.get(required) is None:
            raise ConfigError(f"every upsert_repeatable_bulk item needs {required!r}")


def _score(raw: Any) -> int:
    text = str_reply(raw)
    try:
        return int(text)
    except ValueError:
        return int(float(text))


def _backoff_spec(retry: RetryOverride | None) -> BackoffSpec | None:
    if retry is None or retry.backoff is None:
        return None
    b = retry.backoff
    return BackoffSpec(b.kind, b.delay_ms, b.max_delay_ms, b.multiplier, b.jitter_ms)


# --------------------------------------------------------------------------- flows


class SpecFlows:
    """Pure repeatable-spec logic for one queue; safe to share between tasks and threads."""

    def __init__(self, queue: str, settings: QueueSettings | None = None) -> None:
        self.keys = QueueKeys.for_queue(queue)
        self.settings = settings or QueueSettings()
        self._spec_base = self.keys.repeat_spec("")

    # ---- preparation (no I/O) ----------------------------------------------------------
    def prepare(
        self,
        name: str,
        data: Any,
        *,
        repeat: Any,
        key: str | None = None,
        limit: int | None = None,
        start_after: Any = None,
        end_before: Any = None,
        missed_fires: Any = None,
        attempts: int | None = None,
        backoff: Any = None,
        deadline: Any = None,
        while_paused: str | None = None,
        job_id: str | None = None,
        start_after_ms: int | None = None,
        end_before_ms: int | None = None,
        timeout_ms: Any = None,
        priority: int | None = None,
        group: str | None = None,
        dedup_id: str | None = None,
        dedup_mode: str = "throttle",
        dedup_ttl_ms: Any = None,
        now: int | None = None,
        next_cache: dict[Any, int | None] | None = None,
    ) -> PreparedSpec:
        """Validate and encode one spec.  A spec is named by its key, which is also the id of the
        ``Job`` an upsert returns: ``job_id`` (what chasquimq 1.3 accepts and drops) is taken as
        the key, and giving both with different values is an error.  Every fire gets its own id."""
        key = spec_key_arg(key, job_id)
        now = now_ms() if now is None else now
        name_bytes = validate_job_name(name)
        if not name_bytes:
            raise ConfigError("a repeatable spec needs a non-empty job name")
        pattern = coerce_pattern(repeat)
        policy = coerce_policy(missed_fires)
        spec_key = derive_spec_key(name, pattern, key)
        if len(spec_key.encode("utf-8")) > 1024:
            raise ConfigError("spec key is longer than 1024 bytes")
        start = _epoch_ms(_one_of(start_after, start_after_ms, "start_after"), "start_after")
        end = _epoch_ms(_one_of(end_before, end_before_ms, "end_before"), "end_before")
        if start is not None and end is not None and end <= start:
            raise ConfigError(f"end_before ({end}) must be after start_after ({start})")
        if end is not None and end <= now:
            raise ConfigError(f"end_before ({end}) is in the past: the spec would never fire")
        cache_key = (pattern, start)
        if next_cache is not None and cache_key in next_cache:
            nxt = next_cache[cache_key]
        else:
            nxt = next_fire_after(pattern, now, start)
            if next_cache is not None:
                next_cache[cache_key] = nxt
        if nxt is None:
            raise ConfigError(f"repeat pattern {_describe(pattern)} has no future fire")
        if end is not None and nxt > end:
            raise ConfigError(f"the first fire ({nxt}) of {_describe(pattern)} is after end_before ({end})")
        inner = encode_data(data)
        ext = b""
        skip = _skip_while_paused(while_paused)
        timeout = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        side = side_options(priority, group)
        dedup = dedup_option(dedup_id, dedup_mode, dedup_ttl_ms, side)
        if attempts is not None or backoff is not None or deadline is not None or skip or timeout or side or dedup:
            retry = build_retry_override(attempts, backoff)
            ext_value = SpecExt(retry, _deadline_ms(deadline), skip, timeout, priority, group, dedup)
            ext = b"" if ext_value.empty else ext_value.encode()
        spec = _encode_spec(spec_key, name, pattern, inner, _limit(limit), start, end, policy)
        if len(spec) > self.settings.max_payload_bytes:
            raise ConfigError(
                f"spec {spec_key!r} encodes to {len(spec)} bytes; "
                f"max_payload_bytes is {self.settings.max_payload_bytes}"
            )
        return PreparedSpec(spec_key, nxt, spec, ext)

    def _upsert_call(self, specs: list[PreparedSpec]) -> Call:
        argv: list[Any] = [self._spec_base, 3]
        for key, nxt, spec, _ext in specs:
            argv += (nxt, key, spec)  # a rows.UpsertRow
        return self._upsert_argv(argv, [(j, p[3]) for j, p in enumerate(specs) if p[3]])

    def _upsert_argv(self, argv: list[Any], exts: list[tuple[int, bytes]]) -> Call:
        """The script call for ``argv`` = [base, 3, (next, key, spec) ...]; ``exts`` = the
        (position, ext) of the specs that carry one: then every spec gets its ext slot."""
        if exts:
            wide: list[Any] = [argv[0], 4]
            ext_of = dict(exts)
            for j, i in enumerate(range(2, len(argv), 3)):
                wide += (argv[i], argv[i + 1], argv[i + 2], ext_of.get(j, b""))  # a rows.UpsertExtRow
            argv = wide
        return script_call("upsert_repeatable", (self.keys.repeat, self.keys.repeat_paused), argv)

    # ---- writes ------------------------------------------------------------------------
    def upsert(self, name: str, data: Any, **options: Any) -> Flow[tuple[str, int]]:
        """Returns ``(spec_key, now_ms)``."""
        now = now_ms()
        prepared = self.prepare(name, data, now=now, **options)
        if options.get("timeout_ms") is not None:  # before the spec can fire its first job
            yield from mark_timeouts(self.keys)
        yield self._upsert_call([prepared])
        return prepared.key, now

    def prepare_bulk(
        self,
        items: Iterable[Mapping[str, Any]],
        now: int | None = None,
        caches: tuple[dict[Any, Any], dict[Any, Any]] | None = None,
    ) -> list[PreparedSpec]:
        """``prepare`` for many specs (the bulk path's encoding, as ``PreparedSpec``s)."""
        now = now_ms() if now is None else now
        argv, exts = self._bulk_argv(items if isinstance(items, list) else list(items), now, caches or ({}, {}))
        ext_of = dict(exts)
        return [
            PreparedSpec(argv[i + 1], argv[i], argv[i + 2], ext_of.get(j, b""))
            for j, i in enumerate(range(2, len(argv), 3))
        ]

    def _bulk_argv(
        self, items: list[Any], now: int, caches: tuple[dict[Any, Any], dict[Any, Any]]
    ) -> tuple[list[Any], list[tuple[int, bytes]]]:
        """The ``upsert_repeatable`` arguments of ``items``: ``[base, 3, (next, key, spec) ...]``
        and the (position, ext) of those with an ext.  Items with only name, data, repeat (a
        RepeatPattern) and key take an inlined path (the same checks and bytes as ``prepare``;
        a test compares them) that shares per (pattern, name) the validation, the next fire and
        the encoded head of the StoredSpec; the rest go through ``prepare``."""
        cache, fast = caches
        argv: list[Any] = [self._spec_base, 3]
        exts: list[tuple[int, bytes]] = []
        prepare = self.prepare
        limit = self.settings.max_payload_bytes
        superset = _FAST_KEYS.issuperset
        packb = _packb
        join = b"".join
        bin8 = _BIN8
        for item in items:
            if type(item) is dict and superset(item):
                name, repeat, key = item.get("name"), item.get("repeat"), item.get("key")
                if type(repeat) is RepeatPattern and type(name) is str:
                    per = fast.get((id(repeat), name))  # items share pattern objects: no hashing them
                    if per is None or per[0] is not repeat:
                        if len(fast) > 10_000:
                            fast.clear()
                        per = fast[(id(repeat), name)] = (repeat, *self._fast_head(repeat, name, now, cache))
                    _, nxt, head, wire, suffix = per
                    if head is not None and (key is None or (type(key) is str and len(key) <= 256)):
                        try:
                            inner = packb(item.get("data"))
                        except (TypeError, ValueError, OverflowError):
                            inner = None
                        if inner is not None:
                            spec_key = key or name + suffix
                            n = len(inner)
                            if n < 254:  # bin8(bin8(inner)): the common size, assembled directly
                                spec = join((b"\x98", packb(spec_key), head, bin8[n + 2], bin8[n], inner, _SPEC_TAIL))
                            else:
                                spec = packb([spec_key, name, wire, packb(inner), None, None, None, 0])
                            if len(spec) <= limit:
                                argv += (nxt, spec_key, spec)
                                continue
            _check_item(item)  # the general path, with its precise errors
            p = (
                prepare(now=now, next_cache=cache, **item)
                if "data" in item
                else prepare(data=None, now=now, next_cache=cache, **item)
            )
            if p.ext:
                exts.append(((len(argv) - 2) // 3, p.ext))
            argv += (p.next_fire_ms, p.key, p.spec)
        return argv, exts

    @staticmethod
    def _fast_head(
        pattern: RepeatPattern, name: str, now: int, cache: dict[Any, Any]
    ) -> tuple[int, bytes | None, Any, str]:
        """(next fire, packed name + pattern or None when the name needs the general path,
        pattern wire form, derived key suffix) of a (pattern, name) pair."""
        shared = cache.get(("fast", pattern))  # an equal pattern seen before
        if shared is None:
            shared = cache[("fast", pattern)] = _fast_pattern(pattern, now)
        nxt, wire, suffix = shared
        try:
            raw = validate_job_name(name)
        except (ConfigError, UnicodeError):
            return nxt, None, wire, suffix
        ok = len(raw) > 0 and len(raw) + len(suffix.encode("utf-8")) <= 1024
        return nxt, (_packb(name) + _packb(wire)) if ok else None, wire, suffix

    def upsert_bulk(self, items: Iterable[Mapping[str, Any]]) -> Flow[tuple[list[str], int]]:
        """One script call per 1,000 specs, streamed: each chunk is validated and encoded while
        Redis writes the previous one.  A bad item fails the call before its chunk is sent
        (the chunks before it are written, except on a cluster client, which sends nothing;
        upserts are idempotent).  Returns ``(keys, now_ms)``."""
        items = items if isinstance(items, list) else list(items)
        now = now_ms()
        keys: list[str] = []
        caches: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})

        def calls() -> Iterator[Call]:
            for i in range(0, len(items), UPSERT_CHUNK):
                argv, exts = self._bulk_argv(items[i : i + UPSERT_CHUNK], now, caches)
                keys.extend(argv[3::3])
                yield self._upsert_argv(argv, exts)

        if any(isinstance(i, Mapping) and i.get("timeout_ms") is not None for i in items):
            yield from mark_timeouts(self.keys)  # before any of these specs can fire
        if items:
            yield Stream(calls())
        return keys, now

    def remove(self, key: str) -> Flow[bool]:
        k = self.keys
        reply = yield script_call("remove_repeatable", (k.repeat, k.repeat_spec(_key(key)), k.repeat_paused), (key,))
        return int_reply(reply) == 1

    def pause(self, key: str) -> Flow[bool]:
        """True when the spec is paused now (or already was); False when there is no such spec."""
        k = self.keys
        reply = yield script_call("pause_repeatable", (k.repeat, k.repeat_paused, k.repeat_spec(_key(key))), (key,))
        return int_reply(reply) in (1, 2)

    def resume(self, key: str, now: int | None = None) -> Flow[bool]:
        """Back into ``repeat`` at the first fire after now (windows passed while paused are
        not fired).  True when resumed (or already active), False when there is no such spec."""
        k = self.keys
        for _ in range(5):
            raw, paused_score, active = yield [
                command("HGET", k.repeat_spec(_key(key)), "spec"),
                command("ZSCORE", k.repeat_paused, key),
                command("ZSCORE", k.repeat, key),
            ]
            if raw is None:
                return False
            if paused_score is None:
                return active is not None
            spec = StoredSpec.decode(raw)
            t = now_ms() if now is None else now
            was = _score(paused_score)
            # The spec's own timeline (an interval keeps its phase), from its first fire after now.
            nxt = was if was > t else first_fire_after_now(spec.pattern, was, t, spec.start_after_ms)
            if nxt <= 0 or (spec.end_before_ms is not None and nxt > spec.end_before_ms):
                raise ConfigError(f"spec {key!r} has no fire left (pattern or end_before); remove it instead")
            done = yield script_call(
                "resume_repeatable", (k.repeat, k.repeat_paused, k.repeat_spec(key)), (key, paused_score, nxt)
            )
            if int_reply(done) == 1:
                return True
        raise ConfigError(f"spec {key!r} kept changing while it was being resumed; try again")

    def trigger(self, key: str, now: int | None = None) -> Flow[tuple[str, str, Any] | None]:
        """Fire one job from the spec now, leaving its schedule, counters and pause state alone.

        Returns ``(job_id, job_name, data)``, or None when there is no such spec.
        """
        k = self.keys
        raw, ext_raw = yield command("HMGET", k.repeat_spec(_key(key)), "spec", "ext")
        if raw is None:
            return None
        spec = StoredSpec.decode(raw)
        ext = SpecExt.decode(ext_raw)
        t = now_ms() if now is None else now
        jid = new_job_id(t)
        env = encode_envelope(Envelope(jid, spec.payload_inner, t, 0, ext.retry))
        name = spec.job_name.encode("utf-8")
        args: tuple[Any, ...] = ("XADD", k.stream, "MAXLEN", "~", self.settings.max_stream_len, "*", "d", env)
        yield command(*(args + ("n", name) if name else args))
        return jid, spec.job_name, decode_data(spec.payload_inner)

    # ---- reads -------------------------------------------------------------------------
    def _info(self, key: str, score: Any, paused: bool, fields: list[Any]) -> RepeatableInfo | None:
        """The spec of ``fields`` (HMGET spec ext fired skipped); CodecError naming what is
        wrong when a field, a counter or the score is not what it must be."""
        raw, ext_raw, fired, skipped = fields
        if raw is None:
            return None
        spec = StoredSpec.decode(raw)
        ext = SpecExt.decode(ext_raw)
        next_fire = _instant(score)
        counters = [_counter(name, value) for name, value in (("fired", fired), ("skipped", skipped))]
        try:
            data = decode_data(spec.payload_inner)
        except CodecError:
            data = spec.payload_inner
        return RepeatableInfo(
            key=spec.key if spec.key else key,
            job_name=spec.job_name,
            pattern=spec.pattern,
            next_fire_ms=next_fire,
            limit=spec.limit,
            start_after_ms=spec.start_after_ms,
            end_before_ms=spec.end_before_ms,
            missed_fires=spec.missed_fires,
            paused=paused,
            fired=counters[0],
            skipped=counters[1],
            data=data,
            attempts=None if ext.retry is None else ext.retry.max_attempts,
            backoff=_backoff_spec(ext.retry),
            deadline_ms=ext.deadline_ms,
            while_paused="skip" if ext.skip_while_paused else "queue",
            timeout_ms=ext.timeout_ms,
            priority=ext.priority,
            group=ext.group,
            dedup_id=None if ext.dedup is None else ext.dedup[0],
            dedup_mode=None if ext.dedup is None else ext.dedup[1],
            dedup_ttl_ms=None if ext.dedup is None else ext.dedup[2],
        )

    def get(self, key: str) -> Flow[RepeatableInfo | None]:
        """RepeatableInfo, or None.  A spec that cannot be read raises CodecError (why)."""
        k = self.keys
        active, paused = yield [command("ZSCORE", k.repeat, _key(key)), command("ZSCORE", k.repeat_paused, key)]
        score = active if active is not None else paused
        if score is None:
            return None
        (fields,) = yield from self._read_hashes([key.encode()])
        if isinstance(fields, str):
            raise CodecError(f"spec {key!r} is corrupt: {fields}")
        return self._info(key, score, active is None, fields)

    def _read_hashes(self, raw_keys: list[bytes]) -> Flow[list[Any]]:
        """HMGET spec ext fired skipped of each spec hash, in two round trips (TYPE first: one
        key of another type must not fail the pipeline); a reason instead where it is no hash."""
        base = self._spec_base.encode()
        types = yield [command("TYPE", base + rk) for rk in raw_keys]
        readable = [i for i, t in enumerate(types) if str_reply(t) in ("hash", "none")]
        out: list[Any] = [f"the spec key is a {str_reply(t)}, not a hash" for t in types]
        if readable:
            rows = yield [command("HMGET", base + raw_keys[i], "spec", "ext", "fired", "skipped") for i in readable]
            for i, row in zip(readable, rows):
                out[i] = row
        return out

    def list_page(self, cursor: str | None = None, count: int = 100) -> Flow[tuple[list[RepeatableInfo], str | None]]:
        """One page of specs, active then paused: ``(items, next_cursor)``; None = the end.

        A ZSCAN cursor underneath: a spec present for the whole walk is listed at least once,
        whatever fires or upserts happen meanwhile, and no call loads more than ``count``
        or so entries.  A spec that cannot be read (a key that is not UTF-8, a hash of
        another type, bytes that do not decode, a counter that is no integer, a score that
        is no instant) is listed as a ``CorruptSpec`` with the reason (``item.corrupt``).
        """
        if isinstance(count, bool) or not isinstance(count, int) or not 0 < count <= MAX_PAGE:
            raise ConfigError(f"count must be an int in 1..{MAX_PAGE}, got {count!r}")
        phase, pos = _parse_cursor(cursor)
        k = self.keys
        items: list[RepeatableInfo] = []
        while phase is not None and len(items) < count:
            zset = k.repeat if phase == "r" else k.repeat_paused
            nxt, flat = yield command("ZSCAN", zset, pos, "COUNT", count)
            pairs = [(bytes(flat[i]), flat[i + 1]) for i in range(0, len(flat or []), 2)]
            if pairs:
                rows = yield from self._read_hashes([rk for rk, _s in pairs])
                for (raw_key, score), fields in zip(pairs, rows):
                    items.extend(spec_row(raw_key, score, phase == "p", fields, self._info))
            pos = int_reply(nxt)
            if pos == 0:
                phase, pos = ("p", 0) if phase == "r" else (None, 0)
        return items, None if phase is None else f"{phase}:{pos}"

    def list_meta(self, limit: int = 100) -> Flow[list[RepeatableMeta]]:
        """chasquimq's ``get_repeatable_jobs``: the first ``limit`` active specs by next fire."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 < limit <= MAX_PAGE:
            raise ConfigError(f"limit must be an int in 1..{MAX_PAGE}, got {limit!r}")
        k = self.keys
        flat = yield command("ZRANGE", k.repeat, 0, limit - 1, "WITHSCORES")
        pairs = [(bytes(flat[i]), flat[i + 1]) for i in range(0, len(flat or []), 2)]
        if not pairs:
            return []
        rows = yield from self._read_hashes([rk for rk, _s in pairs])
        out: list[RepeatableMeta] = []
        for (raw_key, score), fields in zip(pairs, rows):
            if isinstance(fields, str) or fields[0] is None:
                continue
            try:  # chasquimq's type has no room for a corrupt spec: it is left out
                raw_key.decode()
                out.append(StoredSpec.decode(fields[0]).to_meta(_instant(score)))
            except ValueError:  # CodecError, ConfigError, UnicodeDecodeError
                continue
        return out

    def quarantined(self) -> Flow[dict[str, bytes]]:
        """``{spec_key: raw stored bytes}`` of the specs the scheduler moved aside."""
        out: dict[str, bytes] = {}
        pos = 0
        while True:
            nxt, flat = yield command("HSCAN", self.keys.repeat_quarantine, pos, "COUNT", 1000)
            for i in range(0, len(flat or []), 2):
                out[show_key(flat[i])] = bytes(flat[i + 1])
            pos = int_reply(nxt)
            if pos == 0:
                return out


def show_key(raw: Any) -> str:
    """A spec key for people and logs: UTF-8, any other bytes escaped (``\\xff``)."""
    return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(raw)


def spec_row(raw_key: bytes, score: Any, paused: bool, fields: Any, info: Any) -> list[Any]:
    """The listing row(s) of one ZSET entry: its RepeatableInfo, a CorruptSpec, or none (no hash)."""
    try:
        if isinstance(fields, str):
            raise CodecError(fields)
        key = raw_key.decode()
        got = info(key, score, paused, fields)
        return [] if got is None else [got]
    except (ValueError, OverflowError) as exc:  # CodecError and ConfigError are ValueErrors
        reason = f"the spec key is not UTF-8 (byte {exc.start})" if isinstance(exc, UnicodeDecodeError) else str(exc)
        return [CorruptSpec(show_key(raw_key), raw_key, paused, str_reply(score), reason)]


def _instant(score: Any) -> int:
    """A ZSET score as epoch ms; CodecError when it is no instant (+-inf, negative)."""
    try:
        ms = _score(score)
    except (ValueError, OverflowError):
        ms = -1
    if ms < 0:
        raise CodecError(f"the score {str_reply(score)} is no instant")
    return ms


def _counter(name: str, value: Any) -> int:
    if value is None:
        return 0
    try:
        return int(value)
    except ValueError:
        raise CodecError(f"the {name} counter is not an integer: {str_reply(value)[:40]!r}") from None


def _key(key: Any) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigError(f"spec key must be a non-empty str, got {key!r}")
    return key


def _parse_cursor(cursor: str | None) -> tuple[str | None, int]:
    if cursor is None or cursor == "":
        return "r", 0
    if isinstance(cursor, str) and len(cursor) > 2 and cursor[0] in "rp" and cursor[1] == ":" and cursor[2:].isdigit():
        return cursor[0], int(cursor[2:])
    raise ConfigError(f"invalid cursor {cursor!r}: pass None to start, then the cursor a page returned")


def _describe(pattern: RepeatPattern) -> str:
    if pattern.kind == "cron":
        return f"cron {pattern.expression!r} in {pattern.tz or 'UTC'}"
    return f"every {pattern.interval_ms} ms"
