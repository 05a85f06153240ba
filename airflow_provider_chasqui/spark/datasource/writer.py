"""The batch and streaming writers of ``format("chasqui")`` (jobs; see :mod:`.encode`).

A write task opens its own connection, streams its partition's chunk calls and returns a
:class:`~.encode.PartitionReport`.  ``commit`` / ``abort`` run on the driver: they log the
totals per partition and keep them, as JSON, under ``{chasqui:<q>}:spark:load:<load_id>`` for
``dedup_ttl_s`` (read with :func:`load_report`), which is how a caller learns the counts
without an accumulator (there is none on Spark Connect).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any, cast

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from ...core.keys import QueueKeys
from ...core.urls import redact_text
from ...errors import ChasquiError, ConfigError
from .encode import ChunkEncoder, PartitionReport, settle
from .options import WritePlan

__all__ = ["STREAM_BATCH_PROPERTY", "ChasquiArrowWriter", "ChasquiStreamWriter", "load_report", "report_key"]

log = logging.getLogger(__name__)

#: The local property Spark's micro-batch execution sets for the tasks of a batch.
STREAM_BATCH_PROPERTY = "streaming.sql.batchId"


class WriteReport(PartitionReport, WriterCommitMessage):
    """A :class:`PartitionReport` Spark accepts as a commit message."""


def report_key(queue: str, load_id: str) -> str:
    return QueueKeys.for_queue(queue).spark_load(load_id)


def _task() -> tuple[int, int, Any]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, None
    return ctx.partitionId(), ctx.attemptNumber(), ctx


def write_partition(plan: WritePlan, load_id: str, batches: Iterator[Any]) -> WriteReport:
    """One task: its partition's rows as chunk calls on one connection; the report."""
    from ...sync.queue import SyncQueue

    partition, attempt, _ctx = _task()
    encoder = ChunkEncoder(plan, partition, load_id)
    report = WriteReport(partition=partition, attempt=attempt)
    with SyncQueue(plan.queue, redis_url=plan.url, settings=plan.settings) as queue:
        try:
            replies = queue.driver.stream(encoder.calls(batches))
        except Exception as exc:
            done = sum(encoder.sent_rows)
            text = (
                f"chasqui: partition {partition} of load {load_id}: {redact_text(exc)} -- the {done} rows "
                f"before it ({len(encoder.sent_rows)} chunks) may have been written; run the same write "
                f"again with option load_id={load_id!r} to write the rest without duplicates"
            )
            raise (ConfigError if isinstance(exc, ConfigError) else ChasquiError)(text) from exc
    return settle(report, encoder, replies, plan.id_col is not None)  # type: ignore[return-value]


def _summary(messages: list[WriterCommitMessage | None]) -> dict[str, Any]:
    reports = [cast(PartitionReport, m) for m in messages if isinstance(m, PartitionReport)]
    parts = [r.as_dict() for r in reports]
    return {
        "rows": sum(p["rows"] for p in parts),
        "added": sum(p["added"] for p in parts),
        "skipped": sum(p["skipped"] for p in parts),
        "failed_tasks": sum(1 for m in messages if m is None),
        "partitions": sorted(parts, key=lambda p: p["partition"]),
        **({"bad": sum(p["bad"] for p in parts)} if any("bad" in p for p in parts) else {}),
    }


def finish(plan: WritePlan, load_id: str, messages: list[WriterCommitMessage | None], status: str) -> dict[str, Any]:
    """Log the totals and keep them in Redis (best effort: the write itself already happened)."""
    summary = {"load_id": load_id, "queue": plan.queue, "status": status, **_summary(messages)}
    if status == "committed":
        log.info(
            "chasqui: %s: %d rows -> %d jobs added, %d skipped as written before, in %d partitions",
            plan.describe(),
            summary["rows"],
            summary["added"],
            summary["skipped"],
            len(summary["partitions"]),
        )
    else:
        log.error(
            "chasqui: %s aborted: %d tasks failed; the %d partitions that finished wrote %d jobs and the "
            "failed tasks may have written some of their chunks. Run the same write again with option "
            "load_id=%r to finish it without duplicates.",
            plan.describe(),
            summary["failed_tasks"],
            len(summary["partitions"]),
            summary["added"],
            load_id,
        )
    try:
        from ...sync.queue import SyncQueue

        with SyncQueue(plan.queue, redis_url=plan.url, settings=plan.settings) as queue:
            queue.driver.client.set(report_key(plan.queue, load_id), json.dumps(summary), px=plan.dedup_ttl_ms)
    except Exception as exc:  # noqa: BLE001 - the report is a convenience; the jobs are written
        log.warning("chasqui: could not store the report of load %s: %s", load_id, redact_text(exc))
    return summary


def load_report(queue: str, load_id: str, *, redis_url: str | None = None) -> dict[str, Any] | None:
    """The totals a ``format("chasqui")`` write stored at its commit (or abort), or None."""
    from ...sync.queue import SyncQueue
    from .options import redis_url as resolve

    url = resolve({"redis_url": redis_url} if redis_url else {})
    with SyncQueue(queue, redis_url=url) as q:
        raw = q.driver.client.get(report_key(queue, load_id))
    return None if raw is None else json.loads(raw)


class ChasquiArrowWriter(DataSourceArrowWriter):
    """``df.write.format("chasqui")``: Arrow batches in, one script call per chunk out."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return write_partition(self.plan, self.plan.load_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        finish(self.plan, self.plan.load_id, messages, "committed")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        finish(self.plan, self.plan.load_id, messages, "aborted")


class ChasquiStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("chasqui")``: each micro-batch is a load ``<load_id>.<batch id>``,
    so a batch replayed after a restart (same checkpoint, same batch id, same rows) writes only
    the chunks its first run did not."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def _load(self, batch_id: Any) -> str:
        return f"{self.plan.load_id}.{batch_id}"

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        _p, _a, ctx = _task()
        batch_id = None if ctx is None else ctx.getLocalProperty(STREAM_BATCH_PROPERTY)
        if batch_id is None:
            raise ChasquiError(
                f"chasqui: the task has no {STREAM_BATCH_PROPERTY} property: cannot derive "
                "exactly-once ids for this micro-batch"
            )
        return write_partition(self.plan, self._load(batch_id), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        finish(self.plan, self._load(batchId), messages, "committed")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        finish(self.plan, self._load(batchId), messages, "aborted")
