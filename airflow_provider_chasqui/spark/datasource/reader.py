"""``spark.read.format("chasqui")``: a queue's events, dead letters, results and repeatable specs
as DataFrames, and ``spark.readStream`` of its events.

The streams (``events``, ``dlq``) are read in parallel: the driver takes the first and last
entry ids once (a snapshot: entries added later are not part of this read) and cuts that range
into ``partitions`` ranges of stream-id milliseconds; each task pages through its range with
XRANGE.  ``results`` splits the stored-results index by rank; ``repeatable`` is one task
paging through the specs.

Filter pushdown (``pushFilters``, folded in ``pushdown.py``): comparisons of the time column
(``ts``; ``stored_at`` for results) with a timestamp narrow what is read: the XRANGE bounds
(stream ids are Redis-clock milliseconds) or the results' score range.  For ``dlq`` (``ts`` is the entry id's time) and
``results`` (``stored_at`` is the score) that is exact and Spark does not filter again; an
event's ``ts`` is the worker's clock when the event happened, which may differ from the id's
time by clock skew and event batching, so for ``events`` the bounds are widened by
``ts_slack_ms`` (default 5 minutes) and Spark re-applies the filter.  ``name = / IN`` (and
``event = / IN`` for events) are applied while reading, before a row is built.  Payloads and
results become JSON strings (bytes as UTF-8, else replaced characters), timestamps Spark
timestamps.  ``spark.readStream`` is
``stream.py``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from ...core.calls import command, str_reply
from ...core.codec import U64_MAX, data_json, decode_data, decode_envelope
from ...core.event_follow import after
from ...core.keys import QueueKeys, validate_queue_name
from ...core.producer import parse_fields
from ...core.scan import ends_call, parse_ends
from ...errors import CodecError, ConfigError
from .options import redis_url
from .pushdown import NO_FILTERS, Pushed, push

__all__ = ["SCHEMAS", "ChasquiReader", "ChasquiFilteringReader", "ReadPlan", "StreamRange", "read_plan"]

SCHEMAS: dict[str, str] = {
    "events": "event_id STRING, ts TIMESTAMP, event STRING, job_id STRING, name STRING, attempt INT, fields STRING",
    "dlq": (
        "dlq_id STRING, ts TIMESTAMP, job_id STRING, name STRING, reason STRING, detail STRING, "
        "source_id STRING, attempt INT, created_at TIMESTAMP, data STRING"
    ),
    "results": "job_id STRING, stored_at TIMESTAMP, result STRING",
    "repeatable": (
        "key STRING, name STRING, kind STRING, cron STRING, tz STRING, every_ms BIGINT, "
        "next_fire TIMESTAMP, paused BOOLEAN, fired BIGINT, skipped BIGINT, `limit` BIGINT, data STRING"
    ),
}
_READ_KEYS = {"queue", "redis_url", "what", "partitions", "page", "path", "on_trim", "start", "ts_slack_ms"}
_PAGE = 5000
#: How far an event's ``ts`` (the worker's clock) may be from its stream id's time (Redis's clock).
DEFAULT_TS_SLACK_MS = 300_000
MAX_TS_SLACK_MS = 7 * 86_400_000
MAX_PARTITIONS = 10_000
MAX_PAGE = 100_000  # entries per XRANGE call


def _ts(ms: Any) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromtimestamp(int(ms) / 1000, tz=_dt.UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _json(value: Any) -> str:
    return data_json(
        value,
        default=lambda o: o.decode("utf-8", "replace") if isinstance(o, (bytes, bytearray)) else str(o),
        ensure_ascii=False,
    )


def _id_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


@dataclass(frozen=True)
class ReadPlan:
    queue: str
    url: str
    what: str
    partitions: int | None
    page: int
    on_trim: str
    start: str
    ts_slack_ms: int = DEFAULT_TS_SLACK_MS

    def queue_obj(self) -> Any:
        from ...sync.queue import SyncQueue

        return SyncQueue(self.queue, redis_url=self.url)


def read_plan(options: Mapping[str, str]) -> ReadPlan:
    opts = {k.lower(): v for k, v in options.items()}
    unknown = sorted(k for k in opts if k not in _READ_KEYS)
    if unknown:
        raise ConfigError(f"chasqui: unknown read options {unknown}; known: {sorted(_READ_KEYS)}")
    queue = opts.get("queue") or opts.get("path")
    if not queue:
        raise ConfigError('chasqui: give the queue: .option("queue", "<name>")')
    validate_queue_name(queue)
    what = opts.get("what", "events")
    if what not in SCHEMAS:
        raise ConfigError(f"chasqui: option what must be one of {sorted(SCHEMAS)}, got {what!r}")
    parts = opts.get("partitions")
    try:
        n_parts = None if parts in (None, "") else int(parts)
        page = int(opts.get("page", _PAGE))
        slack = int(opts.get("ts_slack_ms", DEFAULT_TS_SLACK_MS))
    except ValueError:
        raise ConfigError("chasqui: options partitions, page and ts_slack_ms must be integers") from None
    if (n_parts is not None and n_parts < 1) or page < 1:
        raise ConfigError("chasqui: options partitions and page must be >= 1")
    for what_, value, most in (("partitions", n_parts or 1, MAX_PARTITIONS), ("page", page, MAX_PAGE)):
        if value > most:  # a billion partitions was a billion tasks planned on the driver
            raise ConfigError(f"chasqui: option {what_} must be at most {most:,}, got {value:,}")
    if not 0 <= slack <= MAX_TS_SLACK_MS:
        raise ConfigError(f"chasqui: option ts_slack_ms must be from 0 to {MAX_TS_SLACK_MS:,}, got {slack}")
    on_trim = opts.get("on_trim", "fail")
    if on_trim not in ("fail", "skip"):
        raise ConfigError(f"chasqui: option on_trim must be fail or skip, got {on_trim!r}")
    start = opts.get("start", "earliest")
    if start not in ("earliest", "latest"):
        raise ConfigError(f"chasqui: option start must be earliest or latest, got {start!r}")
    return ReadPlan(
        queue=queue,
        url=redis_url(opts),
        what=what,
        partitions=n_parts,
        page=page,
        on_trim=on_trim,
        start=start,
        ts_slack_ms=slack,
    )


@dataclass
class StreamRange(InputPartition):
    """Entries with ``start <= id <= end`` (``start`` may be exclusive: ``(id``)."""

    start: str
    end: str

    def __init__(self, start: str, end: str) -> None:  # InputPartition's __init__ takes a value
        self.start, self.end = start, end


@dataclass
class RankRange(InputPartition):
    lo: int
    hi: int

    def __init__(self, lo: int, hi: int) -> None:
        self.lo, self.hi = lo, hi


def events_or_dlq_key(plan: ReadPlan) -> str:
    """The stream a plan of ``what="events"`` or ``"dlq"`` reads (the batch and the streaming readers)."""
    k = QueueKeys.for_queue(plan.queue)
    return k.events if plan.what == "events" else k.dlq


def event_row(entry_id: Any, flat: list[Any]) -> tuple[Any, ...]:
    """One stream entry as a row of ``_EVENT_COLUMNS`` (the row-at-a-time path; Arrow batches below)."""
    f = {k: str_reply(v) for k, v in parse_fields(flat or []).items()}
    eid = str_reply(entry_id)
    kind, jid, ts, name, attempt = (
        f.pop("e", None),
        f.pop("id", None),
        f.pop("ts", None),
        f.pop("n", None),
        f.pop("attempt", None),
    )
    return (
        eid,
        _ts(ts) if ts and ts.isdigit() else _ts(_id_ms(eid)),
        kind,
        jid or None,
        name or None,
        int(attempt) if attempt and attempt.isdigit() else None,
        _json(f) if f else None,
    )


_EVENT_COLUMNS = ["event_id", "ts", "event", "job_id", "name", "attempt", "fields"]
_MAX_TS_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z: Spark's (and Arrow's) last timestamp


def _event_batches(schema: Any, entries: Iterator[tuple[Any, list[Any]]], size: int, pushed: Pushed) -> Iterator[Any]:
    """The rows :func:`event_row` makes, as Arrow record batches of up to ``size`` rows."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    arrow = to_arrow_schema(schema, timezone="UTC")  # exactly what Spark checks the batches against
    filtering = pushed.names is not None or pushed.kinds is not None
    cols: list[list[Any]] = [[] for _ in range(7)]
    eids, tss, kinds, jids, names, attempts, rest = cols
    for entry_id, flat in entries:
        if flat and not isinstance(flat[0], bytes):  # a driver that decodes replies
            flat = [x.encode() if isinstance(x, str) else bytes(x) for x in flat]
        f = dict(zip(flat[0::2], flat[1::2]))
        raw_kind, raw_jid, raw_name = f.pop(b"e", None), f.pop(b"id", None), f.pop(b"n", None)
        ts, attempt = f.pop(b"ts", None), f.pop(b"attempt", None)
        kind = None if raw_kind is None else raw_kind.decode("utf-8", "replace")
        name = raw_name.decode("utf-8", "replace") if raw_name else None
        if filtering and not pushed.keeps(name, kind):
            continue
        eid = str_reply(entry_id)
        ms = int(ts) if ts and ts.isdigit() else _id_ms(eid)
        eids.append(eid)
        tss.append(ms * 1000 if ms <= _MAX_TS_MS else None)
        kinds.append(kind)
        jids.append(raw_jid.decode("utf-8", "replace") if raw_jid else None)
        names.append(name)
        attempts.append(int(attempt) if attempt and attempt.isdigit() else None)
        rest.append(
            _json({k.decode("utf-8", "replace"): v.decode("utf-8", "replace") for k, v in f.items()}) if f else None
        )
        if len(eids) >= size:
            yield pa.RecordBatch.from_arrays(
                [pa.array(c, type=field.type) for c, field in zip(cols, arrow)], schema=arrow
            )
            for c in cols:
                c.clear()
    if eids:
        yield pa.RecordBatch.from_arrays([pa.array(c, type=field.type) for c, field in zip(cols, arrow)], schema=arrow)


def _dlq_row(entry_id: Any, flat: list[Any]) -> tuple[Any, ...]:
    f = parse_fields(flat or [])
    eid = str_reply(entry_id)
    jid = attempt = created = data = None
    try:
        env = decode_envelope(bytes(f.get("d", b"")))
        jid, attempt, created = env.id, env.attempt, _ts(env.created_at_ms)
        data = _json(decode_data(env.inner))
    except CodecError:
        pass
    text = {k: str_reply(v) for k, v in f.items() if k != "d"}
    return (
        eid,
        _ts(_id_ms(eid)),
        jid,
        text.get("n"),
        text.get("reason"),
        text.get("detail"),
        text.get("source_id"),
        attempt,
        created,
        data,
    )


class ChasquiReader(DataSourceReader):
    """Batch reads without filter pushdown (Spark's ``spark.sql.python.filterPushdown.enabled``
    off); see the module docstring."""

    def __init__(self, plan: ReadPlan, schema: Any = None) -> None:
        self.plan = plan
        self.pushed = NO_FILTERS
        # Events go to Spark as Arrow record batches built column by column (no per-value
        # conversion of a row tuple) when Spark asks for this source's own schema.
        names = [f.name for f in getattr(schema, "fields", [])]
        self.schema = schema if plan.what == "events" and names == _EVENT_COLUMNS else None

    def partitions(self) -> list[InputPartition]:
        plan, pushed = self.plan, self.pushed
        if pushed.empty():
            return [StreamRange("0-1", "0-0")] if plan.what in ("events", "dlq") else [RankRange(0, -1)]
        with plan.queue_obj() as q:
            call = q.driver.call
            if plan.what in ("events", "dlq"):
                key = events_or_dlq_key(plan)
                ends = parse_ends(call(ends_call(key)))  # ids only: no payload comes back
                if ends is None:
                    return [StreamRange("0-1", "0-0")]  # empty
                lo, hi = ends
                n = plan.partitions or max(1, min(16, int(call(command("XLEN", key))) // 100_000 + 1))
                lo_ms, hi_ms = _id_ms(lo), _id_ms(hi)
                slack = plan.ts_slack_ms if plan.what == "events" else 0
                if pushed.lo_ms is not None and pushed.lo_ms - slack > lo_ms:
                    lo_ms = pushed.lo_ms - slack
                    lo = f"{lo_ms}-0"
                if pushed.hi_ms is not None and pushed.hi_ms + slack < hi_ms:
                    hi_ms = pushed.hi_ms + slack
                    hi = f"{hi_ms}-{U64_MAX}"
                if lo_ms > hi_ms:
                    return [StreamRange("0-1", "0-0")]
                step = max(1, (hi_ms - lo_ms + 1 + n - 1) // n)
                out: list[InputPartition] = []
                ms = lo_ms
                while ms <= hi_ms:
                    top = min(hi_ms, ms + step - 1)
                    out.append(
                        StreamRange(lo if ms == lo_ms else f"{ms}-0", hi if top == hi_ms else f"{top}-{U64_MAX}")
                    )
                    ms = top + 1
                return out
            if plan.what == "results":
                key = QueueKeys.for_queue(plan.queue).results
                # ranks of the scores in [lo_ms, hi_ms]: the index is ordered by score
                first_rank = (
                    0 if pushed.lo_ms is None else int(call(command("ZCOUNT", key, "-inf", f"({pushed.lo_ms}")))
                )
                end_rank = (
                    int(call(command("ZCARD", key)))
                    if pushed.hi_ms is None
                    else int(call(command("ZCOUNT", key, "-inf", pushed.hi_ms)))
                )
                total = max(0, end_rank - first_rank)
                n = plan.partitions or max(1, min(8, total // 50_000 + 1))
                size = max(1, -(-total // n))
                return [
                    RankRange(first_rank + i, first_rank + min(total, i + size) - 1) for i in range(0, total, size)
                ] or [RankRange(0, -1)]
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        plan, pushed = self.plan, self.pushed
        with plan.queue_obj() as q:
            if isinstance(partition, StreamRange):
                entries = xrange_pages(q, events_or_dlq_key(plan), partition.start, partition.end, plan.page)
                if plan.what == "events" and self.schema is not None:
                    yield from _event_batches(self.schema, entries, plan.page, pushed)
                elif plan.what == "events":
                    rows: Iterator[tuple[Any, ...]] = (event_row(eid, flat) for eid, flat in entries)
                    if pushed.names is not None or pushed.kinds is not None:
                        rows = (r for r in rows if pushed.keeps(r[4], r[2]))
                    yield from rows
                elif pushed.names is None:
                    yield from (_dlq_row(eid, flat) for eid, flat in entries)
                else:  # the name is a plain field: skip other names before decoding the payload
                    names = {n.encode() for n in pushed.names}
                    yield from (_dlq_row(eid, flat) for eid, flat in entries if _field(flat, b"n") in names)
            elif isinstance(partition, RankRange):
                yield from _results(q, partition, plan.page, pushed)
            else:
                yield from (s for s in _specs(q, plan.page) if pushed.keeps(s[1]))


class ChasquiFilteringReader(ChasquiReader):
    """Batch reads with filter pushdown (``register()`` turns it on for the session)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.pushed, left = push(self.plan.what, list(filters), self.pushed)
        yield from left


def _field(flat: list[Any], name: bytes) -> Any:
    for i in range(0, len(flat) - 1, 2):
        key = flat[i]
        if (key.encode() if isinstance(key, str) else bytes(key)) == name:
            value = flat[i + 1]
            return value.encode() if isinstance(value, str) else bytes(value)
    return None


def xrange_pages(q: Any, key: str, start: str, end: str, page: int) -> Iterator[tuple[Any, list[Any]]]:
    """The entries of ``key`` from ``start`` to ``end``, read ``page`` at a time."""
    call = q.driver.call
    while True:
        rows = call(command("XRANGE", key, start, end, "COUNT", page)) or []
        yield from rows
        nxt = after(str_reply(rows[-1][0])) if len(rows) == page else None
        if nxt is None:
            return
        start = nxt


def _results(q: Any, part: RankRange, page: int, pushed: Pushed = NO_FILTERS) -> Iterator[tuple[Any, ...]]:
    """Stored results by rank; with a pushed time range, a result stored (or trimmed) since the
    ranks were planned can shift them, so each score is checked against the range too."""
    lo_ms = -1 if pushed.lo_ms is None else pushed.lo_ms
    hi_ms = _MAX_TS_MS if pushed.hi_ms is None else pushed.hi_ms
    k = q.keys
    call = q.driver.call
    for lo in range(part.lo, part.hi + 1, page):
        flat = call(command("ZRANGE", k.results, lo, min(part.hi, lo + page - 1), "WITHSCORES")) or []
        ids = [str_reply(flat[i]) for i in range(0, len(flat), 2)]
        scores = [flat[i + 1] for i in range(0, len(flat), 2)]
        if not ids:
            continue
        raws = q.driver.pipeline([command("GET", k.result(j)) for j in ids])
        for jid, score, raw in zip(ids, scores, raws):
            if raw is None:  # expired since it was indexed
                continue
            try:
                value = _json(decode_data(bytes(raw)))
            except CodecError:
                value = None
            ms = int(float(score))
            if lo_ms <= ms <= hi_ms:
                yield jid, _ts(ms), value


def _specs(q: Any, page: int) -> Iterator[tuple[Any, ...]]:
    cursor: str | None = None
    while True:
        items, cursor = q.list_repeatable(cursor, count=min(page, 1000))
        for s in items:
            if getattr(s, "corrupt", False):
                continue
            p = s.pattern
            cron = p.expression if p.kind == "cron" else None
            yield (
                s.key,
                s.job_name,
                p.kind,
                cron,
                getattr(p, "tz", None) if cron else None,
                getattr(p, "interval_ms", None) if p.kind != "cron" else None,
                _ts(s.next_fire_ms),
                s.paused,
                s.fired,
                s.skipped,
                s.limit,
                _json(s.data),
            )
        if cursor is None:
            return
