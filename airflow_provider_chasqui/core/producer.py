"""Producer operations as flows: every decision of ``Queue`` and ``SyncQueue`` lives here, the
DLQ tools in ``core/dlq.py`` and results, states and waits in ``core/results.py`` (mixed in).

Each public method returns a generator (see :mod:`.calls`) that the asyncio or the blocking
driver runs.  Inputs are validated before anything is sent, so a bad call never leaves a
partial write behind.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import Any

from ..errors import ConfigError, ConfigTypeError
from .backoff import build_retry_override
from .calls import (
    Call,
    Flow,
    Pause,
    Stream,
    command,
    int_reply,
    packed_command,
    reply_pairs,
    resp_bulk,
    script_call,
    str_reply,
)
from .codec import (
    MAX_JOB_ID_CHARS,
    RetryOverride,
    encode_data,
    encode_member,
    encode_new_envelope,
    new_job_id,
    new_job_ids,
    now_ms,
    validate_job_name,
)
from .dedup import check_dedup, dedup_call
from .dlq import DlqFlows, positive
from .fast import fast_constructor
from .groups import add_grouped_call, check_group
from .keys import QueueKeys
from .priorities import add_prioritized_call, check_priority
from .results import ResultFlows
from .running import FIRST_MARK_WAIT_SECS, check_timeout_ms, timeout_calls
from .settings import QueueSettings

__all__ = ["ProducerCore", "PreparedJob", "coerce_delay", "JOB_STATES", "parse_fields"]

BULK_CHUNK = 1000
STREAM_CHUNK = 250  # add_bulk's plain path: jobs per streamed script call (measured: 1.25x over 1,000)
# an envelope's bytes besides the job's data: array, 26-char id, bin header, created_at, attempt
_ENVELOPE_OVERHEAD = 64
JOB_STATES = ("completed", "failed", "cancelled", "delayed", "unknown")
_BULK_KEYS = {
    "name",
    "data",
    "delay",
    "delay_ms",
    "attempts",
    "backoff",
    "job_id",
    "repeat",
    "priority",
    "group",
    "timeout_ms",
}
MAX_UNIQUE_KEY_CHARS = MAX_JOB_ID_CHARS  # a unique key becomes a Redis key name: bounded like job ids


def validate_unique_key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ConfigError(f"unique key must be a non-empty str, got {type(key).__name__} {str(key)[:50]!r}")
    if len(key) > MAX_UNIQUE_KEY_CHARS:
        raise ConfigError(f"unique key is {len(key)} characters; the limit is {MAX_UNIQUE_KEY_CHARS}")
    return key


def coerce_delay(delay: Any = None, delay_ms: Any = None, *, now: int) -> int | None:
    """Absolute run-at in ms, or None for "now".

    ``delay``: int = ms, float = seconds (chasquimq 0.x), ``timedelta``, or an absolute
    ``datetime`` (naive = UTC).  ``delay_ms`` (chasquimq 1.x): int/float ms or a datetime.
    """
    if delay is not None and delay_ms is not None:
        raise ConfigError("pass either delay or delay_ms, not both")
    value, unit_ms = (delay, None) if delay is not None else (delay_ms, 1.0)
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigTypeError("delay must be a number, timedelta or datetime, not bool")
    if isinstance(value, datetime):
        when = value if value.tzinfo else value.replace(tzinfo=UTC)
        run_at = int(when.timestamp() * 1000)
        return run_at if run_at > now else None
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1000
    elif isinstance(value, int):
        ms = float(value)
    elif isinstance(value, float):
        ms = value * (unit_ms if unit_ms is not None else 1000.0)
    else:
        raise ConfigTypeError(f"delay must be int ms, float seconds, timedelta or datetime, got {type(value).__name__}")
    if not math.isfinite(ms) or ms < 0:
        raise ConfigError(f"delay must be a finite non-negative duration, got {value!r}")
    return now + int(ms) if int(ms) > 0 else None


@dataclass(frozen=True, slots=True)
class PreparedJob:
    """A validated, encoded job: everything a write needs, computed before any I/O."""

    id: str
    name: str
    name_bytes: bytes
    envelope: bytes
    created_at_ms: int
    run_at_ms: int | None


# ``PreparedJob(...)``, positional, for ``prepare`` (one per job; see ``core.fast``)
_new_prepared = fast_constructor(PreparedJob)


parse_fields = reply_pairs  # the name the producer's readers have always used


ADD_BATCH = 1000  # concurrent plain adds one batch call carries (engine/coalesce.py, sync/coalesce.py)


class ProducerCore(DlqFlows, ResultFlows):
    """Pure producer logic for one queue; safe to share between tasks and threads."""

    def __init__(self, queue: str, settings: QueueSettings | None = None) -> None:
        self.keys = QueueKeys.for_queue(queue)
        self.settings = settings or QueueSettings()
        # the XADD every immediate add sends, up to the envelope: as args and as RESP bytes
        self._xadd_args: tuple[Any, ...] = (
            "XADD",
            self.keys.stream,
            "MAXLEN",
            "~",
            self.settings.max_stream_len,
            "*",
            "d",
        )
        self._xadd_resp = b"".join([resp_bulk(a) for a in self._xadd_args])
        self._names: dict[Any, tuple[bytes, bytes]] = {}  # name -> (UTF-8, RESP of ``n <name>``)

    def _name(self, name: Any) -> tuple[bytes, bytes]:
        """``validate_job_name`` remembered per name (a queue sees a handful of names)."""
        hit = self._names.get(name) if type(name) is str else None
        if hit is None:
            raw = validate_job_name(name)
            hit = (raw, resp_bulk("n") + resp_bulk(raw) if raw else b"")
            if len(self._names) >= 1024:
                self._names.clear()
            self._names[name] = hit
        return hit

    def quick_add(self, name: str, data: Any, trace: str | None = None) -> tuple[Call, str, int]:
        """``add(prepare(name, data))`` with no option set, as its one call, pre-packed: the
        one-by-one ``add`` hot path (about 2 us instead of 7).  Same checks, same bytes.
        ``trace``: a W3C traceparent, written as the extra field ``tp`` (see ``tracing``).
        Returns ``(call, job_id, created_at_ms)``."""
        name_bytes, tail = self._name(name)
        now = now_ms()
        jid = new_job_id(now)
        envelope = encode_new_envelope(jid, encode_data(data), now)
        if len(envelope) > self.settings.max_payload_bytes:
            self.prepare(name, data, now=now)  # raises prepare()'s own error
        if trace:  # tracing on: not the hot path
            args = self._xadd_args + (envelope,) + (("n", name_bytes) if name_bytes else ()) + ("tp", trace)
            return command(*args), jid, now
        return self._packed_xadd(envelope, name_bytes, tail), jid, now

    def quick_parts(self, name: str, data: Any) -> tuple[bytes, bytes, str, int]:
        """A plain add's ``(envelope, name bytes, job id, created ms)``, checked as ``prepare``
        checks (its own error when the payload is too big): what :meth:`xadd_call` sends alone
        and :meth:`batch_call` with others (the coalesced adds, ``engine/coalesce.py``)."""
        name_bytes = self._name(name)[0]
        now = now_ms()
        jid = new_job_id(now)
        envelope = encode_new_envelope(jid, encode_data(data), now)
        if len(envelope) > self.settings.max_payload_bytes:
            self.prepare(name, data, now=now)  # raises prepare()'s own error
        return envelope, name_bytes, jid, now

    def batch_call(self, rows: Sequence[tuple[bytes, bytes]]) -> Call:
        """One ``enqueue_batch`` call for ``(envelope, name bytes)`` rows: the same entries as one
        XADD each, in order."""
        argv: list[Any] = [self.settings.max_stream_len]
        for envelope, name_bytes in rows:
            argv += (envelope, name_bytes)
        return script_call("enqueue_batch", (self.keys.stream,), tuple(argv))

    def xadd_call(self, envelope: bytes, name_bytes: bytes) -> Call:
        """The pre-packed XADD of one plain add (the coalescers' lone add; ``quick_add`` takes
        the RESP tail from its name cache instead)."""
        return self._packed_xadd(envelope, name_bytes, resp_bulk("n") + resp_bulk(name_bytes) if name_bytes else b"")

    def _packed_xadd(self, envelope: bytes, name_bytes: bytes, tail: bytes) -> Call:
        if name_bytes:
            args = self._xadd_args + (envelope, "n", name_bytes)
            packed = b"*10\r\n%b$%d\r\n%b\r\n%b" % (self._xadd_resp, len(envelope), envelope, tail)
        else:
            args = self._xadd_args + (envelope,)
            packed = b"*8\r\n%b$%d\r\n%b\r\n" % (self._xadd_resp, len(envelope), envelope)
        return packed_command(args, packed)

    # ---- preparation (no I/O) ----------------------------------------------------------
    def prepare(
        self,
        name: str,
        data: Any,
        *,
        delay: Any = None,
        delay_ms: Any = None,
        retry: RetryOverride | None = None,
        job_id: str | None = None,
        now: int | None = None,
    ) -> PreparedJob:
        now = now_ms() if now is None else now
        name_bytes = self._name(name)[0]
        if job_id is not None and (not isinstance(job_id, str) or not job_id.strip() or len(job_id) > MAX_JOB_ID_CHARS):
            raise ConfigError(f"job_id must be a non-empty string of at most {MAX_JOB_ID_CHARS} characters")
        run_at = coerce_delay(delay, delay_ms, now=now)
        limit = self.settings.max_delay_secs
        if run_at is not None and limit and (run_at - now) // 1000 > limit:
            raise ConfigError(f"delay of {(run_at - now) // 1000} s exceeds max_delay_secs={limit}")
        jid = job_id or new_job_id(now)
        envelope = encode_new_envelope(jid, encode_data(data), now, retry)
        if len(envelope) > self.settings.max_payload_bytes:
            raise ConfigError(
                f"job {name!r} encodes to {len(envelope)} bytes; max_payload_bytes is {self.settings.max_payload_bytes}"
            )
        return _new_prepared(jid, name, name_bytes, envelope, now, run_at)

    # ---- writes ------------------------------------------------------------------------
    def _xadd(self, job: PreparedJob, trace: str | None = None) -> Call:
        args = self._xadd_args + (job.envelope,)
        if trace:  # readers locate fields by name: ``tp`` after ``d`` [and ``n``] is ignored by ChasquiMQ
            return command(*(args + (("n", job.name_bytes) if job.name_bytes else ()) + ("tp", trace)))
        return command(*(args + ("n", job.name_bytes) if job.name_bytes else args))

    def add(self, job: PreparedJob, trace: str | None = None) -> Flow[str]:
        """Write one prepared job; returns the job id (the first id when deduplicated).
        ``trace`` (a traceparent) rides on immediate adds only: a delayed member has no room."""
        k = self.keys
        if job.run_at_ms is None:
            yield self._xadd(job, trace)
            return job.id
        member = encode_member(job.name_bytes, job.envelope)
        yield command("ZADD", k.delayed, job.run_at_ms, member)
        return job.id

    def add_with_id(self, job: PreparedJob, trace: str | None = None) -> Flow[str]:
        """Caller-chosen id: delayed adds use ChasquiMQ's dlid/didx script (cancellable);
        immediate adds use a marker held for ``unique_window_ms`` (XADD IDMP's stand-in)."""
        reply = yield self._with_id_call(job, trace)
        return self._with_id_reply(job, reply)

    def _with_id_call(self, job: PreparedJob, trace: str | None = None) -> Call:
        k = self.keys
        if job.run_at_ms is None:
            return self._unique_call(job, job.id, self.settings.unique_window_ms, trace)
        ttl = max(1, (job.run_at_ms - job.created_at_ms) // 1000) + 3600
        member = encode_member(job.name_bytes, job.envelope)
        return script_call(
            "schedule_delayed_idempotent", (k.dlid(job.id), k.delayed, k.didx(job.id)), (ttl, job.run_at_ms, member)
        )

    @staticmethod
    def _with_id_reply(job: PreparedJob, reply: Any) -> str:
        """The first id for an immediate add (``add_unique``'s reply); the caller's for a delayed one."""
        return str_reply(reply[1]) if job.run_at_ms is None else job.id

    def add_unique(
        self, job: PreparedJob, unique_key: str | None, window_ms: int, trace: str | None = None
    ) -> Flow[str]:
        key = validate_unique_key(unique_key or job.id)
        return (yield from self._unique(job, key, window_ms, trace))

    def _unique(self, job: PreparedJob, key: str, window_ms: int, trace: str | None = None) -> Flow[str]:
        reply = yield self._unique_call(job, key, window_ms, trace)
        return str_reply(reply[1])

    def _unique_call(self, job: PreparedJob, key: str, window_ms: int, trace: str | None = None) -> Call:
        k = self.keys
        member = encode_member(job.name_bytes, job.envelope) if job.run_at_ms else b""
        argv: tuple[Any, ...] = (
            window_ms,
            job.id,
            job.run_at_ms or 0,
            self.settings.max_stream_len,
            job.envelope,
            job.name_bytes,
            member,
        )
        if trace and not job.run_at_ms:  # the extra ``tp`` field (see ``tracing``)
            argv += (trace,)
        return script_call("add_unique", (k.unique(key), k.stream, k.delayed), argv)

    def add_bulk(self, jobs: list[PreparedJob]) -> Flow[list[str]]:
        """Immediate jobs go through one script call per 1,000 (the batch-per-round-trip path);
        delayed ones through one ZADD script per 1,000; both in one pipeline."""
        k = self.keys
        calls: list[Call] = []
        now_batch = [j for j in jobs if j.run_at_ms is None]
        later = [j for j in jobs if j.run_at_ms is not None]
        for i in range(0, len(now_batch), BULK_CHUNK):
            argv: list[Any] = [self.settings.max_stream_len]
            for j in now_batch[i : i + BULK_CHUNK]:
                argv += (j.envelope, j.name_bytes)  # a rows.EnqueueRow
            calls.append(script_call("enqueue_batch", (k.stream,), argv))
        for i in range(0, len(later), BULK_CHUNK):
            argv = []
            for j in later[i : i + BULK_CHUNK]:
                argv += (j.run_at_ms, encode_member(j.name_bytes, j.envelope))  # a rows.DelayRow
            calls.append(script_call("delay_batch", (k.delayed,), argv))
        if calls:
            yield calls
        return [j.id for j in jobs]

    def cancel_delayed(self, job_id: str) -> Flow[bool]:
        k = self.keys
        reply = yield script_call("cancel_delayed", (k.delayed, k.didx(job_id), k.dlid(job_id)), ())
        return int_reply(reply) == 1


def bulk_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """Validate one ``add_bulk`` dict (chasquimq's keys)."""
    if type(item) is not dict and not isinstance(item, Mapping):  # the ABC check is slow: dicts skip it
        raise ConfigError(f"add_bulk items must be dicts, got {type(item).__name__}")
    if not item.keys() <= _BULK_KEYS:
        unknown = set(item) - _BULK_KEYS
        raise ConfigError(f"unknown add_bulk keys {sorted(unknown)}; allowed: {sorted(_BULK_KEYS)}")
    if "name" not in item or "data" not in item:
        raise ConfigError("every add_bulk item needs 'name' and 'data'")
    return dict(item)


def _side_lane(what: str, value: Any, options: Mapping[str, Any]) -> None:
    """A valid ``priority`` or ``group``, on a job that can have one: an immediate job without a
    caller id (a delayed one, or one whose id must be deduplicated, enters the stream by another
    path), and not both."""
    if what == "priority":
        check_priority(value)
    else:
        check_group(value)
    for option in ("delay", "delay_ms", "job_id", "group"):
        if option != what and options.get(option) is not None:
            raise ConfigError(
                f"{what} cannot be combined with {option} (such a job waits beside the stream, added now)"
            )


def _row(job_id: str, created_at_ms: int, name: str, data: Any) -> tuple[str, int, str, Any]:
    return job_id, created_at_ms, name, data


def unique_key_for(name: str, inner: bytes) -> str:
    """Default ``add_unique`` key when the caller gives neither key nor job id."""
    return hashlib.sha1(name.encode() + b"\0" + inner).hexdigest()


class QueueFlows(ProducerCore):
    """The public ``Queue``/``SyncQueue`` arguments mapped to flows, shared by both twins."""

    def enqueue(
        self,
        name: str,
        data: Any,
        *,
        delay: Any = None,
        delay_ms: Any = None,
        attempts: Any = None,
        backoff: Any = None,
        job_id: str | None = None,
        trace: str | None = None,
        priority: int | None = None,
        group: str | None = None,
        timeout_ms: Any = None,
    ) -> Flow[tuple[str, int]]:
        """Returns ``(job_id, created_at_ms)``.  ``trace``: see :meth:`add` (a prioritized or
        grouped job carries none).  ``priority``: ``core/priorities.py``; ``group``:
        ``core/groups.py``; ``timeout_ms``: ``core/running.py`` (kept just before the add)."""
        options = {"delay": delay, "delay_ms": delay_ms, "job_id": job_id}
        if priority is not None:
            _side_lane("priority", priority, {**options, "group": group})
        if group is not None:
            _side_lane("group", group, options)
        limit = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        job = self.prepare(
            name, data, delay=delay, delay_ms=delay_ms, retry=build_retry_override(attempts, backoff), job_id=job_id
        )
        if limit is not None:
            yield from self._keep_timeouts([(job, limit)])
        side = None  # beside the stream (checked above: not both)
        if priority is not None:
            side = add_prioritized_call(self.keys, [(priority, encode_member(job.name_bytes, job.envelope))])
        elif group is not None:
            side = add_grouped_call(self.keys, [(group, encode_member(job.name_bytes, job.envelope))])
        if side is not None:
            yield side
            return job.id, job.created_at_ms
        jid = yield from (self.add_with_id(job, trace) if job_id is not None else self.add(job, trace))
        return jid, job.created_at_ms

    def enqueue_dedup(
        self,
        name: str,
        data: Any,
        *,
        dedup_id: Any,
        dedup_mode: Any,
        dedup_ttl_ms: Any,
        attempts: Any = None,
        backoff: Any = None,
        timeout_ms: Any = None,
        others: Mapping[str, Any] | None = None,
    ) -> Flow[tuple[str, int]]:
        """``add(..., dedup_id=)`` (``core/dedup.py``): returns ``(job_id, created_at_ms)``, the
        first job's id when a throttled repeat added nothing.  ``others``: the ``add`` options
        a deduplicated job cannot take, each of which must be None."""
        clash = sorted(k for k, v in (others or {}).items() if v is not None)
        if clash:
            raise ConfigError(f"dedup_id cannot be combined with {', '.join(clash)}")
        did, mode, ttl = check_dedup(dedup_id, dedup_mode, dedup_ttl_ms)
        limit = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        job = self.prepare(name, data, retry=build_retry_override(attempts, backoff))
        if limit is not None:
            yield from self._keep_timeouts([(job, limit)])
        reply = yield dedup_call(
            self.keys,
            did,
            mode,
            ttl,
            job_id=job.id,
            envelope=job.envelope,
            name=job.name_bytes,
            member=encode_member(job.name_bytes, job.envelope) if mode == "debounce" else b"",
            max_stream_len=self.settings.max_stream_len,
            events_max=self.settings.events_max_len,
        )
        return str_reply(reply[1]), job.created_at_ms

    def enqueue_unique(
        self,
        name: str,
        data: Any,
        *,
        job_id: str | None,
        key: str | None,
        window_ms: int,
        delay: Any = None,
        delay_ms: Any = None,
        attempts: Any = None,
        backoff: Any = None,
        trace: str | None = None,
        timeout_ms: Any = None,
    ) -> Flow[tuple[str, int]]:
        positive(window_ms, "window")
        limit = None if timeout_ms is None else check_timeout_ms(timeout_ms)
        job = self.prepare(
            name, data, delay=delay, delay_ms=delay_ms, retry=build_retry_override(attempts, backoff), job_id=job_id
        )
        if limit is not None:
            yield from self._keep_timeouts([(job, limit)])
        inner = encode_data(data)
        jid = yield from self.add_unique(job, key or job_id or unique_key_for(name, inner), window_ms, trace)
        return jid, job.created_at_ms

    def enqueue_bulk(self, items: list[Mapping[str, Any]], make: Any = None) -> Flow[list[Any]]:
        """Returns ``make(job_id, created_at_ms, name, data)`` of each item, in order (by default
        that tuple); caller ids go in one pipeline."""
        make = make or _row
        if not items:
            return []
        plain = self._plain_bulk(items)
        if plain is not None:  # every item just name and data: the common case, streamed
            return (yield from self._plain_bulk_flow(items, *plain, make))
        checked = [bulk_item(i) for i in items]
        if any(i.get("repeat") is not None for i in checked):
            raise ConfigError("add_bulk does not take 'repeat'; use upsert_repeatable_job")
        for i in checked:
            if i.get("priority") is not None:
                _side_lane("priority", i["priority"], i)
            if i.get("group") is not None:
                _side_lane("group", i["group"], i)
        limits = [None if i.get("timeout_ms") is None else check_timeout_ms(i["timeout_ms"]) for i in checked]
        now = now_ms()
        prepared = []
        for i in checked:
            prepared.append(
                self.prepare(
                    i["name"],
                    i["data"],
                    delay=i.get("delay"),
                    delay_ms=i.get("delay_ms"),
                    retry=build_retry_override(i.get("attempts"), i.get("backoff")),
                    job_id=i.get("job_id"),
                    now=now,
                )
            )
        timed = [(p, ms) for p, ms in zip(prepared, limits) if ms is not None]
        if timed:
            yield from self._keep_timeouts(timed)
        urgent = [(i["priority"], p) for i, p in zip(checked, prepared) if i.get("priority") is not None]
        grouped = [(i["group"], p) for i, p in zip(checked, prepared) if i.get("group") is not None]
        side: list[Call] = []  # one script call per BULK_CHUNK, FIFO in the items' order
        for lane, make_call in ((urgent, add_prioritized_call), (grouped, add_grouped_call)):
            members = [(key, encode_member(p.name_bytes, p.envelope)) for key, p in lane]
            side += [make_call(self.keys, members[c : c + BULK_CHUNK]) for c in range(0, len(members), BULK_CHUNK)]
        if side:
            yield side
            aside = {id(p) for _key, p in urgent + grouped}
            prepared_rest = [(i, p) for i, p in zip(checked, prepared) if id(p) not in aside]
        else:
            prepared_rest = list(zip(checked, prepared))
        if not any(i.get("job_id") is not None for i, _p in prepared_rest):
            yield from self.add_bulk([p for _i, p in prepared_rest])
            return [make(p.id, p.created_at_ms, i["name"], i["data"]) for i, p in zip(checked, prepared)]
        plain_jobs = [p for i, p in prepared_rest if i.get("job_id") is None]
        yield from self.add_bulk(plain_jobs)
        with_id = [p for i, p in prepared_rest if i.get("job_id") is not None]
        replies = iter((yield [self._with_id_call(p) for p in with_id]))  # one pipeline for all of them
        jobs = []
        for i, p in zip(checked, prepared):
            jid = self._with_id_reply(p, next(replies)) if i.get("job_id") is not None else p.id
            jobs.append(make(jid, p.created_at_ms, i["name"], i["data"]))
        return jobs

    def _keep_timeouts(self, jobs: list[tuple[PreparedJob, int]]) -> Flow[None]:
        """Keep each job's own timeout (``core/running.py``), in one pipeline before the add.
        The first time a queue gets one, wait until every worker's cached controls must show
        the ``timeouts`` field, so no worker can take this job without reading its timeout."""
        due = [(j.id, ms, 0 if j.run_at_ms is None else j.run_at_ms - j.created_at_ms) for j, ms in jobs]
        replies = yield timeout_calls(self.keys, due)
        if replies and replies[-1] == 1:  # HSET made the field: the queue's first job with a timeout
            yield Pause(FIRST_MARK_WAIT_SECS)

    def _plain_bulk(self, items: list[Mapping[str, Any]]) -> tuple[list[bytes], list[bytes], int] | None:
        """``(name bytes, encoded data, now)`` when every item is a dict of exactly ``name`` and
        ``data``, validated as ``prepare`` validates them (every error is raised here, before
        anything is sent), else None."""
        now = now_ms()
        near_limit = self.settings.max_payload_bytes - _ENVELOPE_OVERHEAD
        names = self._names
        name_list: list[bytes] = []
        inners: list[bytes] = []
        for item in items:
            if type(item) is not dict or len(item) != 2 or "name" not in item or "data" not in item:
                return None
            name, data = item["name"], item["data"]
            hit = names.get(name) if type(name) is str else None
            name_list.append((hit or self._name(name))[0])
            inner = encode_data(data)
            if len(inner) > near_limit:
                self.prepare(name, data, now=now)  # the exact check: raises prepare()'s own error
            inners.append(inner)
        return name_list, inners, now

    def _plain_bulk_flow(
        self, items: list[Mapping[str, Any]], name_list: list[bytes], inners: list[bytes], now: int, make: Any
    ) -> Flow[list[Any]]:
        """Ids and envelopes are made chunk by chunk as the driver sends them, so Redis writes
        one chunk while the next is encoded, and the results are built while it writes the last."""
        jobs: list[Any] = []
        head = (self.settings.max_stream_len,)
        key = (self.keys.stream,)

        def calls() -> Iterator[Call]:
            ids: list[str] = []
            for i in range(0, len(inners), STREAM_CHUNK):
                chunk_ids = new_job_ids(min(STREAM_CHUNK, len(inners) - i), now)
                ids += chunk_ids
                argv: list[Any] = []
                add = argv.extend
                for jid, inner, name_bytes in zip(
                    chunk_ids, inners[i : i + STREAM_CHUNK], name_list[i : i + STREAM_CHUNK]
                ):
                    add((encode_new_envelope(jid, inner, now), name_bytes))  # a rows.EnqueueRow
                yield script_call("enqueue_batch", key, head + tuple(argv))
            jobs.extend(map(make, ids, repeat(now), [i["name"] for i in items], [i["data"] for i in items]))

        yield Stream(calls())
        return jobs
