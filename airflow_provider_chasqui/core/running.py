"""Control of running jobs (issue 25), sans I/O: timeouts, cancellation and progress.

A job's own ``timeout_ms`` (``add``, ``add_bulk``, the enqueue operator) does not ride in the
job: the envelope is ChasquiMQ's and takes no extra element, and a stream entry's extra fields
do not survive the delayed set that retries and delayed jobs go through.  It is kept beside
the job instead, in ``{chasqui:<queue>}:to:<job id>`` (``QueueKeys.job_timeout``), written in
the add's own round trip, and the queue's controls hash gets the field ``timeouts`` so the
workers know to look (one ``MGET`` per batch, only on a queue that ever used a job timeout).
The key lives while the job waits, runs and retries (a retry pushes its expiry past the next
attempt) and is removed when the job completes or is dead-lettered; if nothing removes it, it
expires a day after the job was due.

Cancellation (``Queue.cancel(job_id)``) writes a request, ``{chasqui:<queue>}:cancel`` (a hash:
job id -> when the request lapses), and the controls field ``cancels``; a delayed job is taken
out of the delayed set at once (by its index when it has a caller id, else by a scan).  A worker
that reads a requested job settles it without running it; one that runs it (it looks its
running jobs up every ``CANCEL_POLL_SECS``) cancels the handler.  Either way
``lua/cancel_jobs.lua`` acks the entry and writes the ``cancelled`` marker and event: the job
is never retried nor dead-lettered.

Which timeout applies, first found: the job's own, its handler's (``@handler(name,
timeout_ms=...)``, or the attribute ``chasqui_timeout_ms`` on any handler), the worker's
``job_timeout_ms`` (``--job-timeout``).  Anything stored that is not 1 to 12 digits, or is
over ``MAX_TIMEOUT_MS``, is no job timeout (a hostile value never stalls a worker).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from ..errors import CodecError, ConfigError, ConfigTypeError, UnrecoverableError
from .calls import Call, Flow, Pause, command, int_reply, script_call
from .codec import (
    MAX_JOB_ID_CHARS,
    decode_data,
    decode_envelope,
    encode_data,
    items_list,
    now_ms,
    split_member,
    utf8_text,
)
from .controls import CANCELS_FIELD, CONTROLS_MAX_AGE_MS, TIMEOUTS_FIELD, positive_int
from .keys import QueueKeys, check_consumer_name
from .maintenance import glob_escape
from .rows import COMPLETE_ENTRY_ID, FAIL_ENTRY_ID, FAIL_KIND, CancelRow

__all__ = [
    "MAX_TIMEOUT_MS",
    "TIMEOUT_ATTR",
    "BATCH_ATTR",
    "check_batch",
    "handler_batch",
    "TIMEOUTS_FIELD",
    "TIMEOUT_KEY_GRACE_MS",
    "check_timeout_ms",
    "timeout_calls",
    "mark_timeouts",
    "FIRST_MARK_WAIT_SECS",
    "parse_timeout",
    "handler_timeout",
    "read_timeouts_call",
    "settled_timeout_calls",
    "cancel",
    "cancel_jobs_call",
    "read_cancels_call",
    "parse_cancels",
    "CANCEL_POLL_SECS",
    "check_progress",
    "progress_calls",
    "parse_progress",
    "PROGRESS_FLUSH_SECS",
    "MAX_PROGRESS_BYTES",
]

MAX_TIMEOUT_MS = 7 * 86_400_000  # a week
TIMEOUT_KEY_GRACE_MS = 86_400_000  # a job's timeout key outlives the time its job is due by this
TIMEOUT_ATTR = "chasqui_timeout_ms"  # on a handler: its timeout
BATCH_ATTR = "chasqui_batch_size"  # on a handler: it takes a list of up to this many jobs
MAX_BATCH = 10_000


def check_timeout_ms(value: Any, what: str = "timeout_ms") -> int:
    """A timeout as a user gives it: a finite number of milliseconds, more than 0 and at most a
    week (a float is rounded up to whole ms); else ``ConfigError`` naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number of milliseconds, got {type(value).__name__} {value!r}")
    if not (isinstance(value, int) or math.isfinite(value)) or not 0 < value <= MAX_TIMEOUT_MS:
        raise ConfigError(f"{what} must be more than 0 and at most {MAX_TIMEOUT_MS:,} ms, got {value!r}")
    return int(math.ceil(value))


# the first time a queue is marked as one whose jobs carry timeouts, its producer waits this long
# (workers act on the controls as read at most CONTROLS_MAX_AGE_MS before a batch; plus a margin)
FIRST_MARK_WAIT_SECS = CONTROLS_MAX_AGE_MS / 1000 + 0.05


def mark_timeouts(keys: QueueKeys) -> Flow[None]:
    """Mark the queue as one whose jobs may carry a timeout; the first time, wait until every
    worker's cached controls must show it (a spec upsert does this before its first fire)."""
    reply = yield command("HSET", keys.controls, TIMEOUTS_FIELD, 1)
    if int_reply(reply) == 1:
        yield Pause(FIRST_MARK_WAIT_SECS)


def timeout_calls(keys: QueueKeys, jobs: list[tuple[str, int, int]]) -> list[Call]:
    """Keep each ``(job_id, timeout_ms, due_in_ms)`` and mark the queue as one whose jobs may
    carry a timeout: one pipeline, sent before the add itself."""
    grace = TIMEOUT_KEY_GRACE_MS
    calls = [command("SET", keys.job_timeout(jid), ms, "PX", max(0, due) + grace) for jid, ms, due in jobs]
    return calls + [command("HSET", keys.controls, TIMEOUTS_FIELD, 1)]


def parse_timeout(raw: object) -> int:
    """A stored job timeout, or 0 (none) for anything but the values :func:`timeout_calls` writes."""
    ms = positive_int(raw)
    return ms if ms is not None and ms <= MAX_TIMEOUT_MS else 0


def check_batch(value: Any, what: str = "batch") -> int:
    """A batch size as a user gives it: an int from 1 to ``MAX_BATCH``, else ``ConfigError``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BATCH:
        raise ConfigError(f"{what} must be an int from 1 to {MAX_BATCH:,}, got {value!r}")
    return value


def handler_batch(fn: Any) -> int:
    """A batch handler's size (its ``chasqui_batch_size`` attribute), or 0: one job per call."""
    value = getattr(fn, BATCH_ATTR, None)
    return 0 if value is None else check_batch(value, f"{BATCH_ATTR} of handler {fn!r}")


def handler_timeout(fn: Any) -> int:
    """A handler's own timeout (its ``chasqui_timeout_ms`` attribute), or 0."""
    value = getattr(fn, TIMEOUT_ATTR, None)
    if value is None:
        return 0
    return check_timeout_ms(value, f"{TIMEOUT_ATTR} of handler {fn!r}")


def read_timeouts_call(keys: QueueKeys, job_ids: list[str]) -> Call:
    """``MGET`` of the timeouts of a batch's jobs (one round trip per batch; see the module)."""
    return command("MGET", *[keys.job_timeout(jid) for jid in job_ids])


_RUN_AT = 7  # a retry row's run_at_ms (rows.FAIL_RETRY_ROW)


def settled_timeout_calls(
    keys: QueueKeys, timed: dict[bytes, str], done: list[Any], failed: list[Any], now: int
) -> list[Call]:
    """What settling these rows does to the timeouts kept in ``timed`` (entry id -> job id,
    popped here): a retried job's timeout lives on past its next attempt's time, a completed
    or dead-lettered job's is removed."""
    gone = [timed.pop(row[COMPLETE_ENTRY_ID]) for row in done if row[COMPLETE_ENTRY_ID] in timed]
    calls: list[Call] = []
    for row in failed:
        jid = timed.pop(row[FAIL_ENTRY_ID], None)
        if jid is None:
            continue
        if row[FAIL_KIND] == "r":
            due_in = max(0, int(row[_RUN_AT]) - now)
            calls.append(command("PEXPIRE", keys.job_timeout(jid), due_in + TIMEOUT_KEY_GRACE_MS))
        else:
            gone.append(jid)
    if gone:
        calls.append(command("UNLINK", *[keys.job_timeout(jid) for jid in gone]))
    return calls


# ---- cancellation ---------------------------------------------------------------------------
CANCEL_REQUEST_TTL_MS = 7 * 86_400_000  # a request for a job no worker meets lapses after a week
CANCELLED_TTL_MS = 86_400_000  # how long get_job_state says "cancelled"
CANCEL_POLL_SECS = 0.25  # how often a worker running jobs of a queue with requests looks them up
LEAVE_BEHIND_MS = 1000  # how long a handler may ignore its cancellation before its slot is left behind
PRUNE_SAMPLE = 20  # requests each cancel() samples for lapsed ones
_SCAN_COUNT = 1000
_MS = re.compile(rb"[1-9][0-9]{0,15}")  # a request's lapse time, as cancel() writes it


def check_job_id(job_id: object) -> str:
    """A job id as a user gives one: a non-empty str of at most ``MAX_JOB_ID_CHARS`` characters
    that encodes as UTF-8 (another type is a ``ConfigTypeError``)."""
    if not isinstance(job_id, str):
        raise ConfigTypeError(f"job_id must be a str, got {type(job_id).__name__} {job_id!r:.80}")
    if not job_id or len(job_id) > MAX_JOB_ID_CHARS:
        raise ConfigError(f"job_id must be a non-empty str of at most {MAX_JOB_ID_CHARS} characters, got {job_id!r}")
    utf8_text(job_id, "job_id")
    return job_id


def check_job_ids(job_ids: object) -> list[str]:
    """A sequence of job ids (one str is refused: it would be taken letter by letter), each as
    :func:`check_job_id` wants it."""
    return [check_job_id(j) for j in items_list(job_ids, "job_ids")]


def check_cancel(job_id: object, group: object) -> None:
    """``Queue.cancel``'s arguments, checked before the queue asks the server's features."""
    check_job_id(job_id)
    check_consumer_name(group)


def cancel(keys: QueueKeys, job_id: str, *, group: str, xackdel: bool, events_max: int) -> Flow[str]:
    """``Queue.cancel``: returns ``"cancelled"`` (it was delayed: ended now), ``"requested"``
    (waiting or running: the worker that meets it ends it), or the state it already ended in
    (``"completed"``, ``"failed"``, ``"cancelled"``: nothing to do).  The request is written
    first, so a delayed job promoted while this runs is still cancelled by its worker."""
    check_cancel(job_id, group)
    cancelled, done, failed = yield [
        command("EXISTS", keys.cancelled(job_id)),
        command("EXISTS", keys.result(job_id)),
        command("EXISTS", keys.failure(job_id)),
    ]
    for state, hit in (("cancelled", cancelled), ("completed", done), ("failed", failed)):
        if int_reply(hit):
            return state
    now = now_ms()
    _, _, sample = yield [
        command("HSET", keys.cancel_requests, job_id, now + CANCEL_REQUEST_TTL_MS),
        command("HSET", keys.controls, CANCELS_FIELD, 1),
        command("HRANDFIELD", keys.cancel_requests, PRUNE_SAMPLE, "WITHVALUES"),
    ]
    if isinstance(sample, list):  # requests no worker met (a wrong id): each cancel prunes a few
        fields = [str(f, "utf-8", "replace") if isinstance(f, bytes) else str(f) for f in sample[::2]]
        lapsed = set(fields) - parse_cancels(fields, sample[1::2], now)
        if lapsed:
            yield command("HDEL", keys.cancel_requests, *sorted(lapsed))
    name = yield from take_delayed(keys, job_id)
    if name is None:
        return "requested"
    yield cancel_jobs_call(keys, [(b"", job_id, name or "")], group=group, xackdel=xackdel, events_max=events_max)
    return "cancelled"


def take_delayed(keys: QueueKeys, job_id: str) -> Flow[str | None]:
    """Remove ``job_id`` from the delayed set: through its delayed-id index (``""``: its name
    is not read), else by a scan (its name); None when it is not there."""
    removed = yield script_call("cancel_delayed", (keys.delayed, keys.didx(job_id), keys.dlid(job_id)), ())
    if int_reply(removed):
        return ""
    return (yield from take_member(keys.delayed, job_id))


def take_member(zset: str, job_id: str) -> Flow[str | None]:
    """Find ``job_id``'s member in the delayed or prioritized set ``zset`` (a cursor scan
    matching its id) and remove it; its job name, or None when it is not there (or a promoter
    moved it first)."""
    cursor: object = b"0"
    pattern = "*" + glob_escape(job_id) + "*"
    while True:
        reply = yield command("ZSCAN", zset, cursor, "MATCH", pattern, "COUNT", _SCAN_COUNT)
        cursor, flat = reply[0], reply[1]
        for member in flat[::2]:
            try:
                name, envelope = split_member(member)
                if decode_envelope(envelope).id != job_id:
                    continue
            except (CodecError, ValueError):
                continue
            if int_reply((yield command("ZREM", zset, member))):
                return name
            return None
        if cursor in (b"0", "0", 0):
            return None


def cancel_jobs_call(keys: QueueKeys, rows: list[CancelRow], *, group: str, xackdel: bool, events_max: int) -> Call:
    """``lua/cancel_jobs.lua`` for ``(entry id or b"", job id, name)`` rows."""
    argv: list[Any] = [group, 1 if xackdel else 0, events_max, keys.prefix, CANCELLED_TTL_MS, now_ms()]
    for row in rows:
        argv.extend(row)
    return script_call("cancel_jobs", (keys.stream, keys.events, keys.cancel_requests), argv)


def read_cancels_call(keys: QueueKeys, job_ids: list[str]) -> Call:
    return command("HMGET", keys.cancel_requests, *job_ids)


def parse_cancels(job_ids: list[str], reply: object, now: int) -> set[str]:
    """The ids among ``job_ids`` with a live request (``HMGET``'s reply; a lapsed, hostile or
    missing value is none)."""
    if not isinstance(reply, list):
        return set()
    out = set()
    for jid, raw in zip(job_ids, reply):
        if isinstance(raw, bytes) and _MS.fullmatch(raw) and int(raw) > now:
            out.add(jid)
    return out


# ---- progress -------------------------------------------------------------------------------
MAX_PROGRESS_BYTES = 1024  # a progress value, packed
PROGRESS_FLUSH_SECS = 0.25  # a worker writes its jobs' latest progress at most this often
PROGRESS_TTL_MS = 86_400_000


def check_progress(value: Any) -> bytes:
    """A progress value as a handler gives it: a finite number, or a dict packing to at most
    ``MAX_PROGRESS_BYTES``; its msgpack (else ``ConfigError`` naming the problem)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise ConfigError(f"progress must be a number or a dict, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"progress must be finite, got {value!r}")
    try:
        packed = encode_data(value)
    except Exception as exc:  # noqa: BLE001 - whatever msgpack refuses (a nested object, a huge int, nesting too deep)
        raise ConfigError(f"progress cannot be encoded: {exc}") from None
    if len(packed) > MAX_PROGRESS_BYTES:
        raise ConfigError(f"progress packs to {len(packed)} bytes; the limit is {MAX_PROGRESS_BYTES}")
    if isinstance(value, dict):  # its event carries it as JSON: a tuple key or a NaN failed every flush
        try:  # after the size check: JSON walks a small value only (a deep one was RecursionError)
            json.dumps(value, default=str, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"progress must be JSON-compatible (keys str or numbers, numbers finite): {exc}"
            ) from None
    return packed


# ---- results --------------------------------------------------------------------------------
DEFAULT_MAX_RESULT_BYTES = 1_048_576  # a stored result, packed: as a job's data (max_payload_bytes)
MAX_RESULT_BYTES = 512 * 1_048_576  # Redis' own limit on one argument (proto-max-bulk-len's default)


def result_too_large(size: int, limit: int) -> UnrecoverableError:
    """The failure of a job whose result packs past ``max_result_bytes``: its ack, carrying the
    result, would fail (at Redis' argument limit, or filling its memory), the entry would stay
    pending and run again, and with it every job of its ack batch."""
    return UnrecoverableError(
        f"handler result packs to {size:,} bytes; the limit is max_result_bytes={limit:,} "
        "(store a large result elsewhere and return a reference to it, or raise the limit)"
    )


def attempt_ended(job: Any) -> RuntimeError:
    """What ``update_progress`` raises once its Job's attempt has ended (``engine/progress.py``)."""
    return RuntimeError(
        f"job {job.id} attempt {job.attempt + 1} has ended (completed, failed, timed out or cancelled): "
        "its progress is no longer recorded"
    )


class AttemptEnded:
    """``Job._progress`` of a job whose attempt ended: every report raises :func:`attempt_ended`."""

    __slots__ = ()

    def report(self, job: Any, value: Any) -> None:
        raise attempt_ended(job)

    def log(self, job: Any, line: Any) -> None:
        raise attempt_ended(job)


ATTEMPT_ENDED = AttemptEnded()


def progress_calls(keys: QueueKeys, latest: dict[str, tuple[Any, bytes, str]], events_max: int, now: int) -> list[Call]:
    """The latest progress of each job (id -> (value, its msgpack from :func:`check_progress`,
    the job's name)): kept with the job, and a ``progress`` event each (the value as JSON, for
    readers of the events stream; ``n`` the job's name, when it has one)."""
    calls: list[Call] = []
    for jid, (value, packed, name) in latest.items():
        calls.append(command("SET", keys.progress(jid), packed, "PX", PROGRESS_TTL_MS))
        if events_max > 0:
            text = json.dumps(value, default=str, separators=(",", ":"))
            calls.append(
                command(
                    "XADD",
                    keys.events,
                    "MAXLEN",
                    "~",
                    events_max,
                    "*",
                    "e",
                    "progress",
                    "id",
                    jid,
                    "ts",
                    now,
                    *(("n", name) if name else ()),
                    "progress",
                    text,
                )
            )
    return calls


def parse_progress(raw: object) -> Any:
    """A stored progress value (None when absent or not what a worker writes)."""
    if not isinstance(raw, bytes) or len(raw) > MAX_PROGRESS_BYTES:
        return None
    try:
        value = decode_data(raw)
    except Exception:  # noqa: BLE001 - junk written by hand: no progress
        return None
    return value if isinstance(value, (int, float, dict)) and not isinstance(value, bool) else None
