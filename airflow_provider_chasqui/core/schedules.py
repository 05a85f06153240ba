"""Repeatable-spec CRUD as flows: every decision of the ``*_repeatable*`` methods of ``Queue``
and ``SyncQueue`` (and their sharded forms) lives here or in the modules it draws on: the
options' checks (``core/spec_options.py``), the ``ext`` field (``core/spec_ext.py``) and the
reads (``core/spec_reads.py``).

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

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

import msgpack

from ..errors import ConfigError
from .backoff import build_retry_override
from .calls import Call, Flow, Stream, command, int_reply, script_call
from .codec import (
    Envelope,
    decode_data,
    encode_data,
    encode_envelope,
    items_list,
    new_job_id,
    now_ms,
    utf8_text,
    validate_job_name,
)
from .cron import first_fire_after_now, next_fire_after
from .keys import QueueKeys
from .repeat import (
    MissedFiresPolicy,
    RepeatPattern,
    StoredSpec,
    derive_spec_key,
    pattern_to_wire,
    policy_to_wire,
)
from .running import check_timeout_ms, mark_timeouts
from .settings import QueueSettings
from .spec_ext import SpecExt, dedup_option, side_options
from .spec_options import (
    check_spec_key,
    coerce_pattern,
    coerce_policy,
    deadline_ms,
    epoch_ms,
    one_of,
    skip_while_paused,
    spec_limit,
)
from .spec_reads import SpecReads, stored_ms

__all__ = [
    "PreparedSpec",
    "SpecFlows",
    "bulk_spec_key",
    "spec_key_arg",
    "UPSERT_CHUNK",
    "REPEAT_BULK_KEYS",
]

UPSERT_CHUNK = 1000
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
_packb: Callable[[Any], bytes] = msgpack.Packer(use_bin_type=True, autoreset=True).pack


class PreparedSpec(NamedTuple):
    """A validated, encoded spec: what one upsert writes."""

    key: str
    next_fire_ms: int
    spec: bytes
    ext: bytes = b""


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


# --------------------------------------------------------------------------- flows


class SpecFlows(SpecReads):
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
        if len(utf8_text(spec_key, "spec key")) > 1024:
            raise ConfigError("spec key is longer than 1024 bytes")
        start = epoch_ms(one_of(start_after, start_after_ms, "start_after"), "start_after")
        end = epoch_ms(one_of(end_before, end_before_ms, "end_before"), "end_before")
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
        skip = skip_while_paused(while_paused)
        timeout = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        side = side_options(priority, group)
        dedup = dedup_option(dedup_id, dedup_mode, dedup_ttl_ms, side)
        if attempts is not None or backoff is not None or deadline is not None or skip or timeout or side or dedup:
            retry = build_retry_override(attempts, backoff)
            ext_value = SpecExt(retry, deadline_ms(deadline), skip, timeout, priority, group, dedup)
            ext = b"" if ext_value.empty else ext_value.encode()
        spec = _encode_spec(spec_key, name, pattern, inner, spec_limit(limit), start, end, policy)
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
        items = items_list(items, "specs")
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
        reply = yield script_call(
            "remove_repeatable", (k.repeat, k.repeat_spec(check_spec_key(key)), k.repeat_paused), (key,)
        )
        return int_reply(reply) == 1

    def pause(self, key: str) -> Flow[bool]:
        """True when the spec is paused now (or already was); False when there is no such spec."""
        k = self.keys
        reply = yield script_call(
            "pause_repeatable", (k.repeat, k.repeat_paused, k.repeat_spec(check_spec_key(key))), (key,)
        )
        return int_reply(reply) in (1, 2)

    def resume(self, key: str, now: int | None = None) -> Flow[bool]:
        """Back into ``repeat`` at the first fire after now (windows passed while paused are
        not fired).  True when resumed (or already active), False when there is no such spec."""
        k = self.keys
        for _ in range(5):
            raw, paused_score, active = yield [
                command("HGET", k.repeat_spec(check_spec_key(key)), "spec"),
                command("ZSCORE", k.repeat_paused, key),
                command("ZSCORE", k.repeat, key),
            ]
            if raw is None:
                return False
            if paused_score is None:
                return active is not None
            spec = StoredSpec.decode(raw)
            t = now_ms() if now is None else now
            was = stored_ms(paused_score)
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
        raw, ext_raw = yield command("HMGET", k.repeat_spec(check_spec_key(key)), "spec", "ext")
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


def _describe(pattern: RepeatPattern) -> str:
    if pattern.kind == "cron":
        return f"cron {pattern.expression!r} in {pattern.tz or 'UTC'}"
    return f"every {pattern.interval_ms} ms"
