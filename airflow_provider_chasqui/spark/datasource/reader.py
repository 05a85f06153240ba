"""``spark.read.format("chasqui")``: a queue's events, dead letters, results and repeatable specs
as DataFrames, and ``spark.readStream`` of its events.

The streams (``events``, ``dlq``) are read in parallel: the driver takes the first and last
entry ids once (a snapshot: entries added later are not part of this read) and cuts that range
into ``partitions`` ranges of stream-id milliseconds; each task pages through its range with
XRANGE.  ``results`` splits the stored-results index by rank; ``repeatable`` is one task
paging through the specs.  Payloads and results become JSON strings (bytes as UTF-8, else
replaced characters), timestamps Spark timestamps.  The streaming reader's offsets are stream
ids; a range trimmed away before it was read fails the query (``on_trim=skip`` logs instead).
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

try:  # newer pyspark: Trigger.AvailableNow for Python stream readers (else Spark runs it as one batch)
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - pyspark without it

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in on a pyspark that has no such mixin."""


from ...core.calls import command, str_reply
from ...core.codec import decode_data, decode_envelope
from ...core.keys import QueueKeys, validate_queue_name
from ...core.producer import parse_fields
from ...errors import ChasquiError, CodecError, ConfigError
from .options import redis_url

__all__ = ["SCHEMAS", "ChasquiReader", "ChasquiStreamReader", "ReadPlan", "read_plan"]

log = logging.getLogger(__name__)

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
_READ_KEYS = {"queue", "redis_url", "what", "partitions", "page", "path", "on_trim", "start"}
_PAGE = 5000
_MAX_SEQ = 18446744073709551615


def _ts(ms: Any) -> _dt.datetime | None:
    try:
        return _dt.datetime.fromtimestamp(int(ms) / 1000, tz=_dt.UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def _json(value: Any) -> str:
    return json.dumps(
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
    except ValueError:
        raise ConfigError("chasqui: options partitions and page must be integers") from None
    if (n_parts is not None and n_parts < 1) or page < 1:
        raise ConfigError("chasqui: options partitions and page must be >= 1")
    on_trim = opts.get("on_trim", "fail")
    if on_trim not in ("fail", "skip"):
        raise ConfigError(f"chasqui: option on_trim must be fail or skip, got {on_trim!r}")
    start = opts.get("start", "earliest")
    if start not in ("earliest", "latest"):
        raise ConfigError(f"chasqui: option start must be earliest or latest, got {start!r}")
    return ReadPlan(
        queue=queue, url=redis_url(opts), what=what, partitions=n_parts, page=page, on_trim=on_trim, start=start
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


def _stream_key(plan: ReadPlan) -> str:
    k = QueueKeys.for_queue(plan.queue)
    return k.events if plan.what == "events" else k.dlq


def _event_row(entry_id: Any, flat: list[Any]) -> tuple[Any, ...]:
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
    """Batch reads; see the module docstring."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def partitions(self) -> list[InputPartition]:
        plan = self.plan
        with plan.queue_obj() as q:
            call = q.driver.call
            if plan.what in ("events", "dlq"):
                key = _stream_key(plan)
                first = call(command("XRANGE", key, "-", "+", "COUNT", 1))
                last = call(command("XREVRANGE", key, "+", "-", "COUNT", 1))
                if not first or not last:
                    return [StreamRange("0-1", "0-0")]  # empty
                lo, hi = str_reply(first[0][0]), str_reply(last[0][0])
                n = plan.partitions or max(1, min(16, int(call(command("XLEN", key))) // 100_000 + 1))
                lo_ms, hi_ms = _id_ms(lo), _id_ms(hi)
                step = max(1, (hi_ms - lo_ms + 1 + n - 1) // n)
                out: list[InputPartition] = []
                ms = lo_ms
                while ms <= hi_ms:
                    top = min(hi_ms, ms + step - 1)
                    out.append(
                        StreamRange(lo if ms == lo_ms else f"{ms}-0", hi if top == hi_ms else f"{top}-{_MAX_SEQ}")
                    )
                    ms = top + 1
                return out
            if plan.what == "results":
                total = int(call(command("ZCARD", QueueKeys.for_queue(plan.queue).results)))
                n = plan.partitions or max(1, min(8, total // 50_000 + 1))
                size = max(1, -(-total // n))
                return [RankRange(i, min(total, i + size) - 1) for i in range(0, total, size)] or [RankRange(0, -1)]
        return [InputPartition(0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        plan = self.plan
        with plan.queue_obj() as q:
            if isinstance(partition, StreamRange):
                row = _event_row if plan.what == "events" else _dlq_row
                yield from (
                    row(eid, flat)
                    for eid, flat in _xrange(q, _stream_key(plan), partition.start, partition.end, plan.page)
                )
            elif isinstance(partition, RankRange):
                yield from _results(q, partition, plan.page)
            else:
                yield from _specs(q, plan.page)


def _xrange(q: Any, key: str, start: str, end: str, page: int) -> Iterator[tuple[Any, list[Any]]]:
    call = q.driver.call
    while True:
        rows = call(command("XRANGE", key, start, end, "COUNT", page)) or []
        yield from rows
        if len(rows) < page:
            return
        start = "(" + str_reply(rows[-1][0])


def _results(q: Any, part: RankRange, page: int) -> Iterator[tuple[Any, ...]]:
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
            yield jid, _ts(int(float(score))), value


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


class ChasquiStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("chasqui")`` of ``events`` (offsets: ``{"id": "<stream id>"}``).

    Supports ``trigger(availableNow=True)``: the query reads up to the last event there was when
    it started (in as many micro-batches as Spark plans), then stops."""

    def __init__(self, plan: ReadPlan) -> None:
        if plan.what != "events":
            raise ConfigError("chasqui: readStream follows what=events only")
        self.plan = plan
        self._target: str | None = None  # availableNow: the last event id when the query started

    def _last(self) -> str:
        with self.plan.queue_obj() as q:
            last = q.driver.call(command("XREVRANGE", _stream_key(self.plan), "+", "-", "COUNT", 1))
        return str_reply(last[0][0]) if last else "0-0"

    def initialOffset(self) -> dict[str, Any]:
        return {"id": "0-0" if self.plan.start == "earliest" else self._last()}

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        if self._target is not None:  # never past the target; the start itself once it is reached
            return {"id": self._target} if _newer(self._target, start["id"]) else start
        return {"id": self._last()}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._last()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        if start["id"] == end["id"]:
            return []
        return [StreamRange("(" + start["id"], end["id"])]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        plan = self.plan
        assert isinstance(partition, StreamRange)
        after = partition.start[1:]
        key = _stream_key(plan)
        with plan.queue_obj() as q:
            gone = _max_deleted(q, key)
            if after != "0-0" and gone is not None and _newer(gone, after):
                text = (
                    f"chasqui: events of queue {plan.queue!r} after {after} (up to {gone}) were trimmed "
                    "(events_max_len) before this query read them"
                )
                if plan.on_trim == "fail":
                    raise ChasquiError(text + '; restart from a new checkpoint or set option("on_trim", "skip")')
                log.warning("%s; skipped (on_trim=skip)", text)
            for eid, flat in _xrange(q, key, partition.start, partition.end, plan.page):
                yield _event_row(eid, flat)

    def commit(self, end: dict[str, Any]) -> None:
        pass


def _split(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _newer(a: str, b: str) -> bool:
    return _split(a) > _split(b)


def _max_deleted(q: Any, key: str) -> str | None:
    """The stream's ``max-deleted-entry-id`` (Redis 7+): the newest id trimmed or deleted."""
    try:
        info = q.driver.call(command("XINFO", "STREAM", key))
    except Exception:  # noqa: BLE001 - no stream yet, or a server without the field
        return None
    value = parse_fields(list(info or [])).get("max-deleted-entry-id")
    text = None if value is None else str_reply(value)
    return None if not text or text == "0-0" else text
