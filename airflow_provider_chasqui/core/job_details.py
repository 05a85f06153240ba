"""One job's whole story for ``chasqui job show``, ``Queue.get_job_details`` and the dashboard's
job page: its result, failure record, progress, origin and events, then where it is now
(delayed, waiting, running or dead-lettered), each search bounded; what a bound cut short is
said in ``notes``.  Keys of the wrong type are named in ``notes`` and not read
(``core/key_types.py``), so one spoiled key never fails the view.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import CodecError, JobNotFound
from .calls import Flow, command, int_reply, reply_pairs, str_reply
from .codec import Envelope, decode_data, decode_envelope, split_member, ulid_ms
from .consumer import RETRIES_EXHAUSTED, ROUTING_FAILED, UNRECOVERABLE
from .controls import check_count
from .key_types import Reads, read_types, spoiled_keys, spoiled_note
from .keys import QueueKeys, check_consumer_name
from .maintenance import glob_escape
from .origin import Origin, parse_origin
from .running import check_job_id, parse_progress
from .scan import parse_scan, scan_call

__all__ = ["JobDetails", "job_details", "latest_attempt"]

EVENTS_WINDOW = 1000
LOG_TAIL = 50  # the log lines a job's view shows (the newest; Queue.get_job_logs reads them all)
MAX_EVENTS_WINDOW = 100_000  # a job lookup reads at most this many events (XREVRANGE COUNT)
PAGE = 500
SEARCH_PAGES = 20


@dataclass(slots=True)
class JobDetails:
    queue: str
    id: str
    state: str  # completed, failed, cancelled, active, waiting, delayed or unknown
    name: str | None = None
    data: Any = None
    data_bytes: int | None = None  # size of the job's encoded data; None when no copy of the job was found
    created_at_ms: int | None = None
    attempt: int | None = None  # the latest run that started, 1-indexed as in events (latest_attempt); None: none yet
    envelope_attempt: int | None = None  # the found copy's own count of failed runs (wire; a handler's job.attempt)
    run_at_ms: int | None = None  # delayed: when it becomes due
    entry_id: str | None = None  # stream entry, while waiting or running
    consumer: str | None = None  # running: the worker holding it
    deliveries: int | None = None
    idle_ms: int | None = None
    result: Any = None
    has_result: bool = False
    failure: dict[str, Any] | None = None  # the failure record: reason, detail, finished_at_ms, traceback...
    dlq: dict[str, Any] | None = None  # its DLQ entry: dlq_id, reason, detail and any other field
    progress: Any = None  # the latest progress its handler reported (a number or a small dict)
    logs: list[str] = field(default_factory=list)  # the newest LOG_TAIL lines its handlers logged, oldest first
    log_lines: int = 0  # how many lines its log holds (core/job_logs.py)
    origin: Origin | None = None  # the Airflow DAG run and task that enqueued it (core/origin.py)
    events: list[dict[str, Any]] = field(default_factory=list)  # oldest first
    events_truncated: bool = False  # the window was full: older events may exist
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _failure_record(raw: Any) -> dict[str, Any] | None:
    """``[reason, detail, finished_ms, ...]`` (or a map) as a dict; extra items are kept."""
    if raw is None:
        return None
    try:
        record = decode_data(bytes(raw))
    except Exception as exc:  # noqa: BLE001 - a damaged record is shown, not raised
        return {"unreadable": f"{type(exc).__name__}: {exc}"}
    if isinstance(record, dict):
        return {str(k): v for k, v in record.items()}
    if isinstance(record, list):
        out: dict[str, Any] = dict(zip(("reason", "detail", "finished_at_ms"), record))
        for i, extra in enumerate(record[3:]):
            if isinstance(extra, dict):
                out.update({str(k): v for k, v in extra.items()})
            else:
                out["traceback" if i == 0 and isinstance(extra, str) else f"extra_{i}"] = extra
        return out
    return {"record": record}


def _envelope_of(payload: Any) -> Envelope | None:
    try:
        return decode_envelope(bytes(payload))
    except Exception:  # noqa: BLE001 - foreign or damaged entries do not match
        return None


# DLQ reasons given after a handler ran on that delivery (the envelope's attempt was not bumped)
_RAN_REASONS = frozenset((RETRIES_EXHAUSTED, UNRECOVERABLE, ROUTING_FAILED))


def latest_attempt(env_attempt: int, where: str, dlq_reason: str | None = None) -> int | None:
    """One attempt numbering for every page and command: the 1-indexed number of the latest run
    that started (the number events and worker logs carry), None when none did.  The envelope's
    ``attempt`` counts failed runs (0-indexed, wire protocol 4): a waiting or delayed copy was
    bumped by its last failure; a running copy, and a DLQ copy the worker re-encoded after a
    run, were not."""
    ran = env_attempt + 1 if where == "active" or (where == "failed" and dlq_reason in _RAN_REASONS) else env_attempt
    return ran or None


def _take(d: JobDetails, env: Envelope, name: str) -> None:
    d.name = d.name or name or None
    d.created_at_ms = env.created_at_ms
    d.attempt = env.attempt  # the raw count until job_details knows where the copy was (latest_attempt)
    d.envelope_attempt = env.attempt
    d.data_bytes = len(env.inner)
    try:
        d.data = decode_data(env.inner)
    except Exception as exc:  # noqa: BLE001
        d.notes.append(f"the job's data does not decode: {exc}")


def job_details(  # noqa: C901, PLR0915 - one bounded search in a fixed order (delayed, stream, DLQ), each step reading the last
    queue: str,
    job_id: str,
    *,
    group: str = "default",
    events_window: int = EVENTS_WINDOW,
    search_pages: int = SEARCH_PAGES,
) -> Flow[JobDetails]:
    """Everything known about one job: a :class:`JobDetails`.  The events are the newest
    ``events_window`` of the queue's stream filtered by id; the stream, the delayed set and the
    DLQ are searched ``search_pages`` pages of 500 at most, from the job's creation time
    (ULID ids) or its last ``waiting`` / ``dlq`` event on.  ``JobNotFound`` when none of them
    holds a trace of the id (its message names the bounds that may have hidden one)."""
    check_job_id(job_id)
    check_consumer_name(group)
    check_count("events_window", events_window, MAX_EVENTS_WINDOW)
    k = QueueKeys.for_queue(queue)
    d = JobDetails(queue=queue, id=job_id, state="unknown")
    want = {
        k.result(job_id): "string",
        k.failure(job_id): "string",
        k.didx(job_id): "string",
        k.events: "stream",
        k.progress(job_id): "string",
        k.origin(job_id): "string",
        k.logs(job_id): "list",
        k.delayed: "zset",
        k.stream: "stream",
        k.dlq: "stream",
    }
    types = yield from read_types(list(want))
    d.notes.extend(spoiled_note(key, found, want[key]) for key, found in spoiled_keys(types, want).items())
    reads = Reads(types)
    per_job = {"result": k.result, "failure": k.failure, "didx": k.didx, "progress": k.progress, "origin": k.origin}
    for name, of in per_job.items():
        reads.add(name, of(job_id), "string", command("GET", of(job_id)))
    reads.add("rows", k.events, "stream", command("XREVRANGE", k.events, "+", "-", "COUNT", events_window))
    reads.add("logs", k.logs(job_id), "list", command("LRANGE", k.logs(job_id), -LOG_TAIL, -1))
    reads.add("log_lines", k.logs(job_id), "list", command("LLEN", k.logs(job_id)))
    got = yield from reads.run()
    result, failure, didx, rows = got.get("result"), got.get("failure"), got.get("didx"), got.get("rows")
    progress, origin = got.get("progress"), got.get("origin")
    delayed_ok, stream_ok, dlq_ok = (reads.holds(key, want[key]) for key in (k.delayed, k.stream, k.dlq))
    d.progress = parse_progress(progress)
    d.logs, d.log_lines = [str_reply(line) for line in got.get("logs") or []], int_reply(got.get("log_lines", 0))
    d.origin = parse_origin(origin)
    d.events_truncated = len(rows or []) >= events_window
    hints: dict[str, int] = {}
    for entry_id, flat in reversed(rows or []):
        f = {key: str_reply(v) for key, v in reply_pairs(flat or []).items()}
        if f.get("id") != job_id:
            continue
        ts = int(f["ts"]) if f.get("ts", "").isdigit() else 0
        d.events.append({"event_id": str_reply(entry_id), **f})
        hints[f.get("e", "")] = ts
        d.name = d.name or f.get("n") or None
        if f.get("attempt", "").isdigit():
            d.attempt = max(d.attempt or 0, int(f["attempt"]))
    if d.events_truncated:
        d.notes.append(
            f"only the newest {events_window} events of the queue were read: older events of this "
            "job may exist (or were trimmed)"
        )
    if result is not None:
        d.has_result = True
        try:
            d.result = decode_data(bytes(result))
        except Exception as exc:  # noqa: BLE001
            d.notes.append(f"the stored result does not decode: {exc}")
    d.failure = _failure_record(failure)
    attempts_seen = d.attempt
    where = None
    # 1. delayed, by its index (a caller id) or by a bounded scan of the set
    member = didx if delayed_ok else None
    if member is None and result is None and delayed_ok:
        member = yield from _scan_delayed(k, job_id, search_pages, d)
    if member is not None:
        score = yield command("ZSCORE", k.delayed, member)
        if score is not None:
            try:
                name, env_raw = split_member(bytes(member))
            except CodecError:
                name, env_raw = "", b""
            env = _envelope_of(env_raw)
            if env is not None:
                _take(d, env, name)
            d.run_at_ms, where = int(float(score)), "delayed"
    # 2. the stream: waiting or running
    if where is None and result is None and stream_ok:
        start = hints.get("waiting") or ulid_ms(job_id)
        found = yield from _search_stream(k.stream, job_id, start, search_pages, d, "stream")
        if found is not None:
            entry_id, name, env, _fields = found
            _take(d, env, name)
            d.entry_id, where = entry_id, "waiting"
            groups = yield command("XINFO", "GROUPS", k.stream)  # XPENDING on a missing group is an error
            if any(str_reply(reply_pairs(g).get("name", b"")) == group for g in groups or []):
                pend = yield command("XPENDING", k.stream, group, entry_id, entry_id, 1)
                if pend:
                    _, consumer, idle, count = pend[0]
                    d.consumer, d.idle_ms, d.deliveries = str_reply(consumer), int_reply(idle), int_reply(count)
                    where = "active"
    # 3. the DLQ
    if where is None and dlq_ok and (d.failure is not None or "dlq" in hints or result is None):
        start = hints.get("dlq") or (d.failure or {}).get("finished_at_ms")
        found = yield from _search_stream(
            k.dlq, job_id, start if isinstance(start, int) else None, search_pages, d, "DLQ"
        )
        if found is not None:
            entry_id, name, env, fields = found
            _take(d, env, name)
            d.dlq = {"dlq_id": entry_id, **{key: str_reply(v) for key, v in fields.items() if key not in ("d", "n")}}
            where = "failed"
    if where is not None and d.attempt is not None:
        d.attempt = latest_attempt(d.attempt, where, (d.dlq or {}).get("reason"))
    if attempts_seen is not None:
        d.attempt = max(d.attempt or 0, attempts_seen)
    last = d.events[-1]["e"] if d.events else None
    if where is not None:
        d.state = where
    elif result is not None or last == "completed":
        d.state = "completed"
    elif d.failure is not None or last == "dlq":
        d.state = "failed"
    elif last == "cancelled":
        d.state = "cancelled"
    elif last in ("active", "waiting"):
        d.state = last
        d.notes.append(f"not found where a {last} job would be within the search bounds; the state is its last event")
    if d.state == "unknown" and not d.events:
        bounds = f" ({'; '.join(d.notes)})" if d.notes else ""
        raise JobNotFound(f"no job {job_id!r} on queue {queue!r}: a wrong id or queue, or its records expired{bounds}")
    if d.state == "unknown":
        d.notes.append("its events say neither where it is nor how it ended: its records may have expired")
    return d


SKEW_MS = 60_000  # a stream entry's id is the server's clock; the job id's time is the producer's


# A job's entry is looked for inside Redis (``core/scan.py``): only entries holding its id cross
# the network, other fields cut to 4 KiB, at most 64 MiB read per look (issue 26).
JOB_SEARCH: dict[str, Any] = {"clip": 4096, "whole_d": True, "max_bytes": 64 * 1024 * 1024, "max_matches": 4}


def _search_stream(
    key: str, job_id: str, start_ms: int | None, pages: int, d: JobDetails, what: str
) -> Flow[tuple[str, str, Envelope, dict[str, Any]] | None]:
    """The first entry of ``key`` whose envelope has ``job_id``, looking at most ``pages`` x
    ``PAGE`` entries from ``start_ms`` (less a clock skew) on: ``(entry_id, name, envelope,
    fields)`` or None; a note says where a bound stopped the look."""
    start = "-" if start_ms is None else f"{max(0, start_ms - SKEW_MS)}-0"
    found = parse_scan((yield scan_call(key, start, count=pages * PAGE, needle=job_id.encode(), **JOB_SEARCH)))
    for entry_id, fields, _size in found.matches:
        env = _envelope_of(fields.get("d", b""))
        if env is not None and env.id == job_id:
            return entry_id, str_reply(fields.get("n", b"")), env, fields
    if not found.done:
        d.notes.append(
            f"the {what} was searched from {start} up to entry {found.last or '-'}: the job may be further on"
        )
    return None


def _scan_delayed(k: QueueKeys, job_id: str, pages: int, d: JobDetails) -> Flow[Any]:
    """The delayed member of ``job_id`` (its id is a substring of the member), by a ZSCAN of
    at most ``pages`` calls; None if not met."""
    cursor: Any = "0"
    pattern = "*" + glob_escape(job_id) + "*"
    for _ in range(pages):
        cursor, flat = yield command("ZSCAN", k.delayed, cursor, "MATCH", pattern, "COUNT", PAGE)
        flat = flat or []
        for i in range(0, len(flat), 2):
            try:
                _name, env_raw = split_member(bytes(flat[i]))
            except CodecError:
                continue
            env = _envelope_of(env_raw)
            if env is not None and env.id == job_id:
                return flat[i]
        if str_reply(cursor) == "0":
            return None
    d.notes.append(f"the delayed set was scanned {pages} x {PAGE} members: the job may be there still")
    return None
