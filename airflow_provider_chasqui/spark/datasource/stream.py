"""``spark.readStream.format("chasqui")``: a queue's events as a stream.

Offsets are stream ids with the stream's ``entries-added`` count beside them, so a range
trimmed away before the query read it is found and fails the query (``on_trim=skip`` logs
instead); the rows are the batch reader's (``reader.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

try:  # newer pyspark: Trigger.AvailableNow for Python stream readers (else Spark runs it as one batch)
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - pyspark without it

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stand-in on a pyspark that has no such mixin."""


from ...core.calls import command, str_reply
from ...core.event_follow import stream_id
from ...core.producer import parse_fields
from ...errors import ChasquiError, ConfigError
from .reader import ReadPlan, StreamRange, event_row, events_or_dlq_key, xrange_pages

__all__ = ["ChasquiStreamReader", "StreamBatch", "TrimmedError"]

log = logging.getLogger(__name__)


class ChasquiStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("chasqui")`` of ``events``.

    Offsets are ``{"id": "<stream id>", "seq": <entries ever added up to it>}`` (``XINFO
    STREAM``'s ``last-generated-id`` and ``entries-added``, Redis 7+).  The count is what finds
    a trim: trimming (``XTRIM``, ``events_max_len``) removes the oldest entries and moves no
    "deleted" marker, but ``entries-added - length`` entries are gone; if that is more than the
    ``seq`` of the last offset read, and no entry at or before it is left, entries after it were
    trimmed before this query read them.  Planning a micro-batch (on the driver) and reading it
    (on an executor, in case the trim came in between) both check; with ``on_trim=fail`` (the
    default) the query fails naming the queue and the lost id range, with ``on_trim=skip`` it
    logs a warning and goes on with what is left.

    Supports ``trigger(availableNow=True)``: the query reads up to the last event there was when
    it started (in as many micro-batches as Spark plans), then stops."""

    def __init__(self, plan: ReadPlan) -> None:
        if plan.what != "events":
            raise ConfigError("chasqui: readStream follows what=events only")
        self.plan = plan
        self._target: dict[str, Any] | None = None  # availableNow: the last offset when the query started

    def _last(self) -> dict[str, Any]:
        with self.plan.queue_obj() as q:
            info = _stream_info(q, events_or_dlq_key(self.plan))
        # the last id ever added, even if deleted since: offsets never go back
        return {"id": str_reply(info.get("last-generated-id") or b"0-0"), "seq": int(info.get("entries-added") or 0)}

    def initialOffset(self) -> dict[str, Any]:
        return {"id": "0-0", "seq": 0} if self.plan.start == "earliest" else self._last()

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        # availableNow: never past the target (the last event when the query started)
        last = self._target if self._target is not None else self._last()
        if _newer(start["id"], last["id"]) and last["seq"] > 0:
            raise ChasquiError(
                f"chasqui: the events stream of queue {self.plan.queue!r} now ends at {last['id']}, before this"
                f" query's offset {start['id']}: it was deleted and made again, or its last id lowered (XSETID), as"
                " after an entry at the largest id (which any writer may add), so no new event would ever be read;"
                " start the query from a new checkpoint"
            )
        return last if _newer(last["id"], start["id"]) else start

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._last()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        if start["id"] == end["id"]:
            return []
        with self.plan.queue_obj() as q:
            _check_trim(self.plan, q, start, end)
        return [StreamBatch("(" + start["id"], end["id"], start.get("seq"), end.get("seq"))]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        plan = self.plan
        assert isinstance(partition, StreamRange)
        key = events_or_dlq_key(plan)
        with plan.queue_obj() as q:
            if isinstance(partition, StreamBatch):
                _check_trim(
                    plan,
                    q,
                    {"id": partition.start[1:], "seq": partition.start_seq},
                    {"id": partition.end, "seq": partition.end_seq},
                )
            for eid, flat in xrange_pages(q, key, partition.start, partition.end, plan.page):
                yield event_row(eid, flat)

    def commit(self, end: dict[str, Any]) -> None:
        pass


@dataclass
class StreamBatch(StreamRange):
    """A micro-batch's range with the ``entries-added`` counts of its two offsets."""

    start_seq: int | None
    end_seq: int | None

    def __init__(self, start: str, end: str, start_seq: int | None, end_seq: int | None) -> None:
        self.start, self.end, self.start_seq, self.end_seq = start, end, start_seq, end_seq


class TrimmedError(ChasquiError):
    """Events the streaming query had not read yet were trimmed from the stream."""


def _check_trim(plan: ReadPlan, q: Any, start: dict[str, Any], end: dict[str, Any]) -> None:
    """Fail (or, ``on_trim=skip``, log) if entries after ``start`` were trimmed unread."""
    after, seq = start["id"], start.get("seq")
    if after == "0-0" or seq is None:  # start=earliest: whatever the stream holds is the beginning
        return
    info = _stream_info(q, events_or_dlq_key(plan))
    if not info:
        return
    first = info.get("first-entry")
    first_id = str_reply(first[0]) if first else None
    gone = int(info.get("entries-added") or 0) - int(info.get("length") or 0)  # trimmed or deleted, ever
    if gone <= int(seq) or (first_id is not None and not _newer(first_id, after)):
        return  # nothing after `after` is missing (or what is missing was XDELed, not trimmed)
    end_seq = end.get("seq")
    lost = gone - int(seq) if end_seq is None else min(gone, int(end_seq)) - int(seq)
    upto = f"{first_id})" if first_id is not None and (end_seq is None or gone < int(end_seq)) else f"{end['id']}]"
    # `lost` is exact for trims; entries XDELed (not trimmed) since would be counted too: "up to"
    text = (
        f"chasqui: up to {lost} event(s) of queue {plan.queue!r} in the id range ({after}, {upto} were trimmed from "
        f"the stream (XTRIM / events_max_len) before this streaming query read them"
    )
    if plan.on_trim == "fail":
        raise TrimmedError(
            text + '; to accept the loss and go on, restart the query with .option("on_trim", "skip")'
            " (or from a new checkpoint)"
        )
    log.warning("%s; going on with the entries left (on_trim=skip)", text)


def _newer(a: str, b: str) -> bool:
    return stream_id(a) > stream_id(b)


def _stream_info(q: Any, key: str) -> dict[str, Any]:
    """``XINFO STREAM`` as a dict (empty if there is no stream yet)."""
    try:
        info = q.driver.call(command("XINFO", "STREAM", key))
    except Exception:  # noqa: BLE001 - no stream yet
        return {}
    return parse_fields(list(info or []))
