"""Producer operations as flows: how each kind of add is encoded and sent (``ProducerCore``);
the public arguments mapped onto them in ``core/enqueue.py`` (``QueueFlows``), the DLQ tools in
``core/dlq.py`` and results, states and waits in ``core/results.py`` (mixed in).

Each public method returns a generator (see :mod:`.calls`) that the asyncio or the blocking
driver runs.  Inputs are validated before anything is sent, so a bad call never leaves a
partial write behind.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import ConfigError, ConfigTypeError
from .calls import (
    Call,
    Flow,
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
    now_ms,
    utf8_text,
    validate_job_name,
)
from .dlq import DlqFlows
from .fast import fast_constructor
from .keys import QueueKeys
from .results import ResultFlows
from .running import check_job_id
from .settings import QueueSettings

__all__ = ["ProducerCore", "PreparedJob", "coerce_delay", "JOB_STATES", "parse_fields"]

BULK_CHUNK = 1000
JOB_STATES = ("completed", "failed", "cancelled", "delayed", "unknown")
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
        if job_id is not None:
            utf8_text(job_id, "job_id")
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
        check_job_id(job_id)
        k = self.keys
        reply = yield script_call("cancel_delayed", (k.delayed, k.didx(job_id), k.dlid(job_id)), ())
        return int_reply(reply) == 1
