"""Pure consumer decisions (wire spec 13.3-13.5): parse an entry, gate it, and build the
Lua calls that complete, retry or dead-letter it.  The asyncio worker only moves bytes.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .calls import Call, command, script_call
from .codec import (
    MAX_JOB_ID_CHARS,
    MAX_JOB_NAME_BYTES,
    U32_MAX,
    U64_MAX,
    Envelope,
    _new_envelope,
    decode_data,
    decode_envelope,
    decode_retry,
    encode_envelope,
    encode_member,
)
from .failure import clip_head, clip_text, handler_failure_reason, handler_traceback, safe_repr
from .features import Features
from .groups import MAX_GROUP_BYTES
from .keys import QueueKeys
from .retry import RetryPolicy, backoff_ms
from .rows import CompleteRow as CompleteRow  # re-exported: the drivers import the row types from here
from .rows import FailRow as FailRow
from .settings import QueueSettings

__all__ = ["ConsumerCore", "Delivery", "Rejected"]

# DLQ reason strings, exactly as ChasquiMQ writes them (wire spec 7.2).
RETRIES_EXHAUSTED = "retries_exhausted"
UNRECOVERABLE = "unrecoverable"
DECODE_FAILED = "decode_failed"
OVERSIZE = "oversize_payload"
MALFORMED = "malformed"
# Ours, not ChasquiMQ's: routing a handler's failure raised (see ConsumerCore.routing_failed_row).
ROUTING_FAILED = "routing_failed"
# chasquimq's stalled-job detector's (after 1.x): an entry reclaimed from consumers that stopped
# renewing it ``max_stalled_attempts`` times (ConsumerCore.stall_limit).
STALLED = "stalled"

UNDECODED: Any = object()
"""``Delivery.data`` until :meth:`Delivery.payload` decodes it."""
# Data up to this size is decoded on arrival, in the read loop (most jobs: the hot path stays one
# unpackb per job); a whole read-ahead window of it decodes to at most ~72 x 1 KiB x the window
# (26 MB for the default 356).  Larger data is decoded when its job starts.
EAGER_DATA_BYTES = 1024


@dataclass(slots=True)
class Delivery:
    """A job ready for a handler.  Its envelope is decoded at arrival, its data then only when
    at most ``EAGER_DATA_BYTES``, else when it starts (:meth:`payload`): a worker's read-ahead
    window holds bytes and small decoded data, so its memory is bounded by the window whatever
    producers send (issue 26)."""

    entry_id: bytes
    envelope: Envelope
    name: str
    raw: bytes
    delivery_count: int = 1
    started_ns: int = 0
    data: Any = field(default=UNDECODED)
    raw_name: bytes = b""  # the entry's original ``n`` bytes when ``name`` does not carry them (not UTF-8)
    trace: bytes = b""  # the producer's W3C traceparent (extra field ``tp``), when it sent one
    group: bytes = b""  # the job's group (extra field ``g``, core/groups.py), when it has one
    timeout_ms: int = 0  # the job's own timeout (core/running.py), read beside the job; 0: none

    def payload(self) -> Any:
        """The job's data, decoded on first use (``codec.decode_data``: bounded; CodecError when
        it is not msgpack or expands too far: see :meth:`ConsumerCore.undecodable`)."""
        data = self.data
        if data is UNDECODED:
            data = self.data = decode_data(self.envelope.inner)
        return data


@dataclass(frozen=True, slots=True)
class Rejected:
    """An entry the arrival gate sends straight to the DLQ."""

    entry_id: bytes
    reason: str
    payload: bytes
    name: str
    detail: str = ""
    job_id: str = ""
    attempt: int = 0
    dlq_name: bytes = b""  # the entry's original ``n`` bytes when ``name`` does not carry them


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class ConsumerCore:
    """Decisions for one queue and group; holds no connection.  Not shared across loops."""

    def __init__(
        self,
        queue: str,
        *,
        group: str,
        consumer_id: str,
        max_attempts: int,
        settings: QueueSettings,
        retry: RetryPolicy,
        events: bool,
        result_ttl_ms: int,
        failure_ttl_ms: int,
        stall_limit: int | None = None,
    ) -> None:
        self.keys = QueueKeys.for_queue(queue)
        # the stalls (reclaims of one entry: its delivery count - 1) that dead-letter it; None: no limit
        self.stall_limit = stall_limit
        self.group = group
        self.consumer_id = consumer_id
        self.max_attempts = min(max_attempts, U32_MAX)  # an attempt past u32 cannot be encoded
        self.settings = settings
        self.retry_policy = retry
        self.events_max = settings.events_max_len if events else 0
        self.result_ttl_ms = result_ttl_ms
        self.failure_ttl_ms = failure_ttl_ms
        self.rng = random.Random()

    # ---- reading -----------------------------------------------------------------------
    def create_group(self) -> Call:
        return command("XGROUP", "CREATE", self.keys.stream, self.group, "0", "MKSTREAM")

    def read(self, count: int, block_ms: int | None) -> Call:
        args: tuple[Any, ...] = ("XREADGROUP", "GROUP", self.group, self.consumer_id, "COUNT", count)
        if block_ms is not None:
            args += ("BLOCK", block_ms)
        return command(*args, "STREAMS", self.keys.stream, ">")

    def idle_pending(self, min_idle_ms: int, count: int) -> Call:
        return command("XPENDING", self.keys.stream, self.group, "IDLE", min_idle_ms, "-", "+", count)

    def own_pending(self, after: str, count: int) -> Call:
        """This consumer's pending entries after ``after`` (``-`` from the start, ``(id``
        exclusive), oldest first: what an earlier run of the same consumer left unsettled."""
        return command("XPENDING", self.keys.stream, self.group, after, "+", count, self.consumer_id)

    def claim(self, min_idle_ms: int, entry_ids: list[bytes]) -> Call:
        return command("XCLAIM", self.keys.stream, self.group, self.consumer_id, min_idle_ms, *entry_ids)

    def renew_lease(self, entry_ids: list[bytes]) -> Call:
        """Re-claim (``XCLAIM ... 0 ... JUSTID``: idle time reset, delivery count kept) the
        entries this consumer still owns, in one ``renew_lease`` call; the reply lists
        ``entry_id, owner`` of each one it no longer owns (owner ``b""``: not pending)."""
        return script_call("renew_lease", (self.keys.stream,), (self.group, self.consumer_id, *entry_ids))

    def reap_consumers(self, min_idle_ms: int, name: str = "") -> Call:
        """``XGROUP DELCONSUMER`` each consumer (or only ``name``) with nothing pending and idle
        at least ``min_idle_ms``, atomically with the check, sparing the ones whose worker beats
        (``core/liveness.py``); the reply lists the names removed."""
        return script_call("reap_consumers", (self.keys.stream, self.keys.beats), (self.group, min_idle_ms, name))

    def rewind_group(self) -> Call:
        """Move the group's cursor back if it is past the stream's last id (``rewind_group.lua``:
        nothing new could ever be read); the reply is the id it was moved to, or empty."""
        return script_call("rewind_group", (self.keys.stream,), (self.group,))

    def gate(self, entry_id: bytes, fields: Any, delivery_count: int) -> Delivery | Rejected:
        """Arrival gate, in ChasquiMQ's order: malformed, oversize, decode, attempts."""
        tp = g = None
        if type(fields) is list and len(fields) == 4 and fields[0] == b"d" and fields[2] == b"n":
            d, n = fields[1], fields[3]  # fast path: the layout every producer writes
        else:
            if not isinstance(fields, list):
                return Rejected(entry_id, MALFORMED, b"", "", "fields not an array")
            d = n = None
            for i in range(0, len(fields) - 1, 2):
                key = fields[i]
                if key == b"d":
                    d = fields[i + 1]
                elif key == b"n":
                    n = fields[i + 1]
                elif key == b"tp":  # ours: the trace context (see ``tracing``); ChasquiMQ ignores it
                    tp = fields[i + 1]
                elif key == b"g":  # ours: the job's group (``core/groups.py``); ChasquiMQ ignores it
                    g = fields[i + 1]
        # the DLQ keeps the original ``n`` bytes; events get the decoded name, if not too long
        raw_name = n if isinstance(n, bytes) else b""
        long_name = len(raw_name) > MAX_JOB_NAME_BYTES
        name = "" if long_name else raw_name.decode("utf-8", "replace")
        keep = raw_name if long_name or name.encode("utf-8") != raw_name else b""
        if not isinstance(d, bytes):
            return Rejected(entry_id, MALFORMED, b"", "", "missing or non-bytes payload field", dlq_name=raw_name)
        if len(d) > self.settings.max_payload_bytes:  # the scripts copy its `d` inside Redis: no payload sent back
            return Rejected(entry_id, OVERSIZE, b"", name, dlq_name=keep)
        try:
            if long_name:
                raise ValueError(f"job name is {len(raw_name)} bytes; the limit is {MAX_JOB_NAME_BYTES}")
            env = decode_envelope(d)
        except Exception as exc:  # noqa: BLE001 - any decode problem is decode_failed
            return Rejected(entry_id, DECODE_FAILED, d, "", clip_text(str(exc), 200), dlq_name=raw_name)
        limit = self._max_attempts(env)
        prior = max(env.attempt, delivery_count - 1)
        if prior + 1 > limit:
            return Rejected(entry_id, RETRIES_EXHAUSTED, d, name, "", env.id, prior, keep)
        if self.stall_limit is not None and delivery_count - 1 >= self.stall_limit:
            detail = f"reclaimed {delivery_count - 1} times from consumers that stopped renewing it"
            return Rejected(entry_id, STALLED, d, name, detail, env.id, prior, keep)
        trace = tp if isinstance(tp, bytes) and len(tp) <= 512 else b""
        group = g if isinstance(g, bytes) and 0 < len(g) <= MAX_GROUP_BYTES and _utf8(g) else b""  # else: no group
        return Delivery(entry_id, env, name, d, delivery_count, 0, UNDECODED, keep, trace, group)

    def gate_fresh(self, entries: list[Any]) -> tuple[list[Delivery], list[Rejected]]:
        """``gate(entry_id, fields, 1)`` for each ``(entry_id, fields)`` of one XREADGROUP reply,
        in one loop: the layout every producer writes is decoded inline (a function call per
        step cost about as much as the decoding); anything else takes :meth:`gate`."""
        ready: list[Delivery] = []
        rejected: list[Rejected] = []
        unpackb = msgpack.unpackb
        eager = EAGER_DATA_BYTES
        max_bytes = self.settings.max_payload_bytes
        limit = self.max_attempts
        for entry_id, fields in entries:
            if type(fields) is list and len(fields) == 4 and fields[0] == b"d" and fields[2] == b"n":
                d, n = fields[1], fields[3]
                if type(d) is bytes and type(n) is bytes and len(d) <= max_bytes and len(n) <= MAX_JOB_NAME_BYTES:
                    try:
                        arr = unpackb(d, raw=False, strict_map_key=False)
                        if type(arr) is list and len(arr) == 4:
                            job_id, inner, created, attempt = arr
                            retry, top = None, limit
                        elif type(arr) is list and len(arr) == 5:  # with a retry override (memoised)
                            job_id, inner, created, attempt, raw_retry = arr
                            retry = decode_retry(raw_retry)  # raises on a bad one: gate() below says why
                            top = limit if retry is None or retry.max_attempts is None else retry.max_attempts
                        else:
                            arr = None
                        if (
                            arr is not None
                            and type(job_id) is str
                            and type(inner) is bytes
                            and type(created) is int
                            and type(attempt) is int
                            and 0 <= created <= U64_MAX
                            and 0 <= attempt < top
                            and attempt <= U32_MAX
                            and len(job_id) <= MAX_JOB_ID_CHARS
                        ):
                            # small data decodes here, in this loop (the hot path); larger data
                            # when its job starts (Delivery.payload): see EAGER_DATA_BYTES
                            data = unpackb(inner, raw=False, strict_map_key=False) if len(inner) <= eager else UNDECODED
                            name = n.decode()  # not UTF-8: gate() below keeps the bytes too
                            ready.append(
                                Delivery(
                                    entry_id,
                                    _new_envelope(job_id, inner, created, attempt, retry),
                                    name,
                                    d,
                                    1,
                                    0,
                                    data,
                                )
                            )
                            continue
                    except Exception:  # noqa: BLE001 - gate() below gives the exact verdict
                        pass
            verdict = self.gate(entry_id, fields, 1)
            if isinstance(verdict, Rejected):
                rejected.append(verdict)
            else:
                ready.append(verdict)
        return ready, rejected

    def gate_rows(self, rows: list[tuple[bytes, Any, int]]) -> tuple[list[Delivery], list[Rejected]]:
        """:meth:`gate` for each ``(entry_id, fields, delivery_count)`` of a claim."""
        ready: list[Delivery] = []
        rejected: list[Rejected] = []
        for entry_id, fields, count in rows:
            verdict = self.gate(entry_id, fields, count)
            if isinstance(verdict, Rejected):
                rejected.append(verdict)
            else:
                ready.append(verdict)
        return ready, rejected

    def _max_attempts(self, env: Envelope) -> int:
        if env.retry is not None and env.retry.max_attempts is not None:
            return env.retry.max_attempts
        return self.max_attempts

    # ---- outcomes ----------------------------------------------------------------------
    def active_events_compact(self, deliveries: list[Delivery], now: int) -> Call | None:
        """One ``active`` event per delivery (``e id ts [n] attempt``, ``n`` only for a named
        job), in ``emit_events``' compact form: 3 arguments per job."""
        if not self.events_max or not deliveries:
            return None
        argv: list[Any] = [self.events_max, 0, "active", now]
        for dl in deliveries:  # not through job_events: a generator adds a fifth to this, per job
            env = dl.envelope
            argv += (env.id, dl.name, env.attempt + 1)
        return script_call("emit_events", (self.keys.events,), argv)

    def job_events(self, kind: str, jobs: Iterable[tuple[str, str, int]], now: int) -> Call | None:
        """One ``kind`` event per ``(job id, name, 1-indexed attempt)`` (``e id ts [n]
        attempt``), in ``emit_events``' compact form; None with events off or no job."""
        if not self.events_max:
            return None
        argv: list[Any] = [self.events_max, 0, kind, now]
        for job in jobs:
            argv += job
        return script_call("emit_events", (self.keys.events,), argv) if len(argv) > 4 else None

    def drained_event(self, now: int) -> Call | None:
        if not self.events_max:
            return None
        return script_call(
            "emit_events", (self.keys.events,), (self.events_max, 3, "e", "drained", "id", "", "ts", now)
        )

    def complete(self, done: list[CompleteRow], features: Features, now: int) -> Call:
        """``done`` rows: (entry_id, job_id, name, attempt_1_indexed, duration_us, result)."""
        argv: list[Any] = [
            self.group,
            features.xackdel_flag,
            self.events_max,
            self.result_ttl_ms,
            self.keys.prefix,
            now,
            self.settings.results_max_len,
        ]
        for row in done:
            argv.extend(row)
        return script_call("complete_batch", (self.keys.stream, self.keys.events), argv)

    def failure_row(
        self, dl: Delivery, exc: BaseException, unrecoverable: bool, duration_us: int, now: int, tb: str | None = None
    ) -> tuple[FailRow, str, int]:
        """The retry-or-DLQ decision after a handler error, as one ``fail_batch`` row (the worker
        buffers failures like successes).  Returns (row, outcome, backoff_ms); the run-at time
        is fixed here.  The DLQ entry keeps the entry's original ``d`` and ``n`` bytes, and a
        retry carries the original name bytes on (handlers see the name decoded).  ``tb``: the
        exception's :func:`handler_traceback` (None: formatted here), kept in the DLQ entry's
        ``detail`` and the failure record of a dead-lettered job; a retried row carries none."""
        env, reason = dl.envelope, handler_failure_reason(exc)
        run = env.attempt + 1
        nxt = env.attempt + 1
        if unrecoverable or nxt >= self._max_attempts(env):
            why = UNRECOVERABLE if unrecoverable else RETRIES_EXHAUSTED
            return (
                (
                    "d",
                    dl.entry_id,
                    env.id,
                    dl.name,
                    run,
                    reason,
                    duration_us,
                    dl.raw,
                    why,
                    "",
                    dl.raw_name or "",
                    handler_traceback(exc) if tb is None else tb,
                ),
                why,
                0,
            )
        delay = backoff_ms(nxt, env.retry.backoff if env.retry else None, self.retry_policy, self.rng)
        member = encode_member(dl.raw_name or dl.name.encode("utf-8"), encode_envelope(env.with_attempt(nxt)))
        return (
            ("r", dl.entry_id, env.id, dl.name, run, reason, duration_us, now + delay, member, nxt + 1, delay, ""),
            "retry",
            delay,
        )

    @staticmethod
    def undecodable(dl: Delivery, exc: Exception) -> Rejected:
        """``dl`` dead-lettered as ``decode_failed`` because its data did not decode when it was
        about to start (:meth:`Delivery.payload`); the DLQ keeps its bytes, as the gate's would."""
        return Rejected(
            dl.entry_id,
            DECODE_FAILED,
            dl.raw,
            dl.name,
            clip_text(str(exc), 200),
            dl.envelope.id,
            dl.envelope.attempt,
            dl.raw_name,
        )

    def reject_row(self, r: Rejected) -> FailRow:
        """A refused arrival as one ``fail_batch`` row (no handler ran: no ``failed`` event).
        The DLQ entry keeps the original ``d`` and ``n`` bytes (``dlq_name`` when ``name``
        does not carry them)."""
        # `malformed` carries a `detail` on the wire (spec 7.2); `decode_failed` and `stalled` too,
        # here: what failed, the stalls (an optional field ChasquiMQ's readers accept).  The others are logged.
        detail = r.detail if r.reason in (MALFORMED, DECODE_FAILED, STALLED) else ""
        return ("d", r.entry_id, r.job_id, r.name, r.attempt, "", 0, r.payload, r.reason, detail, r.dlq_name, "")

    @staticmethod
    def refusal_row(
        entry_id: bytes, job_id: str, name: str, attempt: int, payload: bytes, detail: str, dlq_name: bytes = b""
    ) -> FailRow:
        """A job its consumer took but will not run (every Airflow asset watcher refused it: their
        reasons in ``detail``) as one ``fail_batch`` DLQ row, reason ``unrecoverable``; no
        handler ran, so no ``failed`` event."""
        return ("d", entry_id, job_id, name, attempt, "", 0, payload, UNRECOVERABLE, clip_text(detail), dlq_name, "")

    def fail(self, rows: list[FailRow], features: Features, now: int) -> Call:
        """One ``fail_batch`` call for rows of :meth:`failure_row` / :meth:`reject_row` (12 values each)."""
        k = self.keys
        argv: list[Any] = [
            self.group,
            features.xackdel_flag,
            self.events_max,
            self.settings.dlq_max_len,
            self.failure_ttl_ms,
            k.prefix,
            now,
            self.settings.failures_max_len,
        ]
        for row in rows:
            argv.extend(row)
        return script_call("fail_batch", (k.stream, k.delayed, k.dlq, k.events), argv)

    def dead_letter(
        self,
        entry_id: bytes,
        reason: str,
        payload: bytes,
        name: str,
        detail: str,
        job_id: str,
        attempt: int,
        features: Features,
        now: int,
        *,
        failed_reason: str = "",
        duration_us: int = 0,
        dlq_name: bytes = b"",
        traceback_text: str = "",
    ) -> Call:
        k = self.keys
        return script_call(
            "dead_letter",
            (k.stream, k.dlq, k.events),
            (
                self.group,
                entry_id,
                features.xackdel_flag,
                self.settings.dlq_max_len,
                self.events_max,
                now,
                payload,
                name,
                reason,
                clip_text(detail),
                job_id,
                attempt,
                failed_reason,
                duration_us,
                self.failure_ttl_ms,
                k.prefix,
                self.settings.failures_max_len,
                dlq_name,
                clip_head(traceback_text) if traceback_text else "",
            ),
        )

    def reject(self, r: Rejected, features: Features, now: int) -> Call:
        """:meth:`reject_row` as one ``dead_letter`` call (the queue trigger's path)."""
        _, entry_id, job_id, name, attempt, _, _, payload, reason, detail, dlq_name, _tb = self.reject_row(r)
        return self.dead_letter(
            entry_id, reason, payload, name, detail, job_id, attempt, features, now, dlq_name=dlq_name
        )

    def routing_failed_row(self, dl: Delivery, exc: BaseException, err: BaseException, duration_us: int) -> FailRow:
        """A DLQ row (reason ``routing_failed``) for a failure whose routing itself raised
        (``err``: a hostile retry override, an exception whose ``repr`` raises...).  Built only
        from values that cannot raise, so the entry is always settled."""
        env = dl.envelope
        return (
            "d",
            dl.entry_id,
            env.id,
            dl.name,
            env.attempt + 1,
            handler_failure_reason(exc),
            duration_us,
            dl.raw,
            ROUTING_FAILED,
            clip_text("routing the failure raised: " + safe_repr(err)),
            dl.raw_name or "",
            handler_traceback(exc),
        )
