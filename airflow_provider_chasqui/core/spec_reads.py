"""Reading repeatable specs back: one spec (``get_repeatable``), a page of them with a cursor
(``list_repeatable``, the dashboard's spec pages), chasquimq's ``get_repeatable_jobs`` and the
quarantine.  A spec that cannot be read is listed as a :class:`CorruptSpec` with the reason
instead of failing the page; a spec hash of another type is read as such a reason (TYPE
first), never as a failed pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import CodecError, ConfigError
from .backoff import BackoffSpec
from .calls import Flow, command, int_reply, str_reply
from .codec import RetryOverride, decode_data
from .keys import QueueKeys
from .repeat import RepeatableMeta, StoredSpec
from .spec_ext import SpecExt
from .spec_options import check_spec_key

__all__ = ["RepeatableInfo", "CorruptSpec", "SpecReads", "show_key", "spec_row", "stored_ms", "MAX_PAGE"]

MAX_PAGE = 10_000


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


class SpecReads:
    """``SpecFlows``' reads (a mixin: it needs the queue's ``keys`` and the spec hashes' prefix)."""

    keys: QueueKeys
    _spec_base: str

    def _info(self, key: str, score: Any, paused: bool, fields: list[Any]) -> RepeatableInfo | None:
        """The spec of ``fields`` (HMGET spec ext fired skipped); CodecError naming what is
        wrong when a field, a counter or the score is not what it must be."""
        raw, ext_raw, fired, skipped = fields
        if raw is None:
            return None
        spec = StoredSpec.decode(raw)
        ext = SpecExt.decode(ext_raw)
        next_fire = instant(score)
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
            missed_fires=None if spec.missed_fires.kind == "skip" else spec.missed_fires,  # as chasquimq lists it
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
        active, paused = yield [
            command("ZSCORE", k.repeat, check_spec_key(key)),
            command("ZSCORE", k.repeat_paused, key),
        ]
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
        phase, pos = parse_cursor(cursor)
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
                out.append(StoredSpec.decode(fields[0]).to_meta(instant(score)))
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


def instant(score: Any) -> int:
    """A ZSET score as epoch ms; CodecError when it is no instant (+-inf, negative)."""
    try:
        ms = stored_ms(score)
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


def parse_cursor(cursor: str | None) -> tuple[str | None, int]:
    if cursor is None or cursor == "":
        return "r", 0
    if isinstance(cursor, str) and len(cursor) > 2 and cursor[0] in "rp" and cursor[1] == ":" and cursor[2:].isdigit():
        return cursor[0], int(cursor[2:])
    raise ConfigError(f"invalid cursor {cursor!r}: pass None to start, then the cursor a page returned")


def stored_ms(raw: Any) -> int:
    """A stored score (``ZSCORE``'s reply) as int milliseconds."""
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
