"""``ChasquiQueueEventTrigger``: Chasqui queues as Airflow asset events (event-driven DAGs).

Use it through common-messaging (the provider registers the scheme ``chasqui``)::

    Asset("incoming_files", watchers=[AssetWatcher(
        name="incoming_files_watcher",
        trigger=MessageQueueTrigger(scheme="chasqui", queue_name="files", job_names=["file_arrived"]),
    )])

Two modes, both run by the triggerer's shared-stream manager in *ack mode* (Airflow 3.3):
the trigger's producer reads Redis, every subscribed trigger turns raw entries into
``TriggerEvent``\\ s, and the producer's ``advance`` is only called for entries whose events
Airflow has **saved** in its metadata database.

**One asset event per read batch.**  Each event carries a list of jobs, oldest first, at most
``max_batch`` (default 100, up to 1000): payload ``{"mode", "queue", "count", "jobs": [...]}``.
Once the reader finds a job it keeps reading while more arrive within ``linger_ms`` (default
100 ms, for about a second at most), so a burst is one event and one DAG run; the next batch
is read only after Airflow saved this one.  Why: up to Airflow 3.3 a DAG run consumes only the
asset events saved before the scheduler queued it, and events saved after that, before the run
was created, wait for the *next* event to get a run (apache/airflow#56050) -- with one event
per job, 4 of a burst of 5 jobs waited, possibly forever.  With one event per batch and at most
one unsaved batch, a burst is one event; consecutive events reach the database in order and at
least one triggerer sync apart (plus ``event_gap_ms``, default 0), so only a scheduler slower
than that can still leave one waiting on 3.3.  Airflow 3.4 links each queued run to the events that caused it
(apache/airflow#70972): no event waits for a later one there.  On both, a run may carry several
events (a busy scheduler merges them, in order): tasks iterate every event, then every job of
each.

``mode="queue"`` -- the jobs of a queue become asset events.
    The producer is a consumer of the queue in ChasquiMQ's consumer group ``default`` (the
    group chasqui and ChasquiMQ workers read), under the consumer name
    ``airflow-asset-watcher``.  A separate group cannot work: ChasquiMQ acknowledges with
    XACK + XDEL, so a job finished by one group vanishes from every other group.  The
    watcher therefore *is* a worker of that queue: give it a queue of its own (a chasqui
    worker on the same queue would take some of the jobs).  It also runs the queue's
    delayed-job promoter (leader-locked, as in every worker), so delayed jobs arrive.
    A batch starts with what is owed (the watcher's own pending entries from an earlier run,
    redeliveries, idle entries of dead consumers), then new jobs.  An entry is acknowledged
    (``complete_batch``: XACK + XDEL, or XACKDEL on Redis 8.2+, and a ``completed`` event)
    only in ``advance``, after the asset events were saved; until then the watcher renews the
    batch's leases (ten times per ``claim_min_idle_ms``), so a metadata database slower than
    the lease does not let another consumer reclaim them.  Entries
    still pending when the triggerer dies are re-read from the consumer's pending list when
    the watcher starts again; entries pending for other, dead consumers are claimed after
    ``claim_min_idle_ms``.  Every redelivery counts as an attempt, and the arrival gate
    dead-letters a job whose attempts are exhausted, so duplicates stay bounded.  Jobs a
    watcher refuses (its ``job_names`` do not include the job's name, or the job's data is not
    JSON-compatible: bytes, a key that is not a str, NaN or infinity) go to the DLQ with reason
    ``unrecoverable`` and a ``detail`` saying why, unless another watcher of the same queue
    accepted them.

``mode="completion"`` -- DAGs run when jobs of a given name complete.
    The producer follows ``{chasqui:<q>}:events`` (XREAD, no group; workers write it unless
    started with events off) and fires for ``e=completed`` entries whose ``n`` is in
    ``job_names`` (any name when None), a batch of them per event.  Its position is a cursor
    in Redis, ``{chasqui:<q>}:cursor:<cursor>``, written in ``advance`` only after the events up to it
    were saved: a restarted triggerer resumes right after the last saved event, so nothing is
    skipped, and the only replay possible is of events saved in the last instant before a
    crash or shutdown (saved, but the confirmation had not reached the triggerer yet).  A new
    cursor starts at the end of the stream.  Events trimmed from the stream (``MAXLEN``)
    before the watcher read them are reported in the triggerer log.

Payloads are JSON-safe dicts; in each of ``jobs``, ``job_id`` plus ``entry_id`` (queue) or
``event_id`` (completion) identify an entry, so a DAG can drop a rare duplicate.  Outside the
triggerer's shared-stream manager, ``run()`` drives the same producer itself and acknowledges
a batch when the caller asks for the next event (not gated on the database).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import AsyncIterator, Hashable, Sequence
from typing import Any

from airflow.triggers.base import BaseEventTrigger, TriggerEvent

from ..core.codec import utf8_text
from ..core.keys import validate_queue_name
from ..errors import ConfigError
from ..hooks.chasqui import ChasquiHook, check_conn_id
from ._batching import (
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_BATCH,
    AdvanceItem,
    AdvanceOutcome,
    check_batching,
    reject_shared_stream_event,
)
from .completion_watcher import CompletedJob, CompletionBatch, CompletionModeProducer
from .job import json_safe_problem
from .queue_watcher import WATCHER_CONSUMER, QueueBatch, QueueJob, QueueModeProducer

__all__ = [
    "ChasquiQueueEventTrigger",
    "QueueModeProducer",
    "CompletionModeProducer",
    "QueueBatch",
    "QueueJob",
    "CompletionBatch",
    "CompletedJob",
    "DEFAULT_MAX_BATCH",
    "MODES",
    "WATCHER_CONSUMER",
    "default_cursor",
]

MODES = ("queue", "completion")


def default_cursor(job_names: Sequence[str] | None) -> str:
    """The completion-mode cursor name when none is given: one per set of watched names."""
    label = ",".join(job_names) if job_names else "*"
    if len(label) <= 64 and not set(label) & set("{}\r\n\0"):
        return "airflow:" + label
    return "airflow:" + hashlib.sha1(label.encode("utf-8")).hexdigest()[:16]


# ---- the trigger --------------------------------------------------------------------------------
def _names(job_names: Any) -> list[str] | None:
    if job_names is None:
        return None
    if isinstance(job_names, str) or not isinstance(job_names, (list, tuple, set, frozenset)):
        raise ValueError(f"job_names must be a list of job names or None, got {job_names!r}")
    if not job_names or not all(isinstance(n, str) and n for n in job_names):  # before sorting: 1 < "a" raises
        raise ValueError(f"job_names must hold non-empty strings, got {job_names!r}")
    for name in job_names:
        utf8_text(name, "job_names")
    return sorted(set(job_names))


class ChasquiQueueEventTrigger(BaseEventTrigger):
    """Fires one asset event per read batch: the jobs read from a queue (``mode="queue"``) or the
    jobs that completed (``mode="completion"``), oldest first, at most ``max_batch`` of them;
    see the module documentation for delivery guarantees.

    :param queue_name: the Chasqui queue.
    :param mode: ``"queue"`` (the watcher consumes the queue's jobs) or ``"completion"`` (it
        follows the queue's events stream and fires when jobs complete).
    :param job_names: only these job names (None = every name).  Queue mode dead-letters jobs of
        other names (as a worker without a handler does) unless another watcher takes them.
    :param chasqui_conn_id: the ``chasqui`` connection.
    :param cursor: completion mode only: the name of the cursor kept at
        ``{chasqui:<queue>}:cursor:<cursor>``; default ``airflow:<job names>`` (one per set of
        names).  Give each independent watcher of one queue its own cursor.
    :param max_batch: at most this many jobs per asset event (1 to 1000, default 100).
    :param linger_ms: once a job is read, keep reading while more arrive within this many
        milliseconds (0 to 5000, default 100), so a burst is one event.
    :param event_gap_ms: after a batch was saved and acknowledged, wait this much longer before
        reading the next (0 to 600000, default 0): on Airflow 3.3, a scheduler that takes longer
        than a triggerer sync to start a run can otherwise leave the next event waiting.
    """

    def __init__(
        self,
        *,
        queue_name: str,
        mode: str = "queue",
        job_names: list[str] | None = None,
        chasqui_conn_id: str = ChasquiHook.default_conn_name,
        cursor: str | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        linger_ms: int = DEFAULT_LINGER_MS,
        event_gap_ms: int = 0,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # BaseTrigger.__init__ is unannotated
        try:
            validate_queue_name(queue_name)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if cursor is not None:
            if mode != "completion":
                raise ValueError("cursor only applies to mode='completion'")
            if not isinstance(cursor, str) or not cursor or set(cursor) & set("{}\r\n\0"):
                raise ValueError(
                    f"cursor must be a non-empty name without braces or control characters, got {cursor!r}"
                )
            utf8_text(cursor, "cursor")
        check_conn_id(chasqui_conn_id)
        check_batching(max_batch, linger_ms, event_gap_ms)
        self.queue_name = queue_name
        self.mode = mode
        self.job_names = _names(job_names)
        self.chasqui_conn_id = chasqui_conn_id
        self.cursor = cursor
        self.max_batch = max_batch
        self.linger_ms = linger_ms
        self.event_gap_ms = event_gap_ms

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue_name": self.queue_name,
                "mode": self.mode,
                "job_names": None if self.job_names is None else list(self.job_names),
                "chasqui_conn_id": self.chasqui_conn_id,
                "cursor": self.cursor,
                "max_batch": self.max_batch,
                "linger_ms": self.linger_ms,
                "event_gap_ms": self.event_gap_ms,
            },
        )

    @property
    def cursor_name(self) -> str | None:
        """The completion-mode cursor actually used (None in queue mode)."""
        if self.mode != "completion":
            return None
        return self.cursor or default_cursor(self.job_names)

    # -- shared stream (the triggerer's path) ---------------------------------------------------------
    def shared_stream_key(self) -> Hashable:
        """Watchers of one queue share one reader: queue mode per (connection, queue),
        completion mode per (connection, queue, cursor).  The shared reader is built from the
        first watcher's arguments, so its ``max_batch``, ``linger_ms`` and ``event_gap_ms`` apply
        to all."""
        if self.mode == "queue":
            return ("chasqui", "queue", self.chasqui_conn_id, self.queue_name)
        return ("chasqui", "completion", self.chasqui_conn_id, self.queue_name, self.cursor_name)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> QueueModeProducer | CompletionModeProducer:
        trigger = cls(**kwargs)
        if trigger.mode == "queue":
            return QueueModeProducer(
                queue_name=trigger.queue_name,
                chasqui_conn_id=trigger.chasqui_conn_id,
                max_batch=trigger.max_batch,
                linger_ms=trigger.linger_ms,
                event_gap_ms=trigger.event_gap_ms,
            )
        return CompletionModeProducer(
            queue_name=trigger.queue_name,
            chasqui_conn_id=trigger.chasqui_conn_id,
            cursor=trigger.cursor_name or "",
            max_batch=trigger.max_batch,
            linger_ms=trigger.linger_ms,
            event_gap_ms=trigger.event_gap_ms,
        )

    def refusal(self, job: QueueJob) -> str | None:
        """Why this watcher refuses one queued job (dead-lettered unless another watcher takes it)."""
        if self.job_names is not None and job.name not in self.job_names:
            return f"job name {job.name!r} is not watched (watching {', '.join(self.job_names)})"
        problem = json_safe_problem(job.data, "data")
        if problem:
            return f"{problem}: an asset event carries JSON-compatible data only"
        return None

    def decide(self, raw: QueueBatch | CompletionBatch) -> TriggerEvent | str | None:
        """This watcher's verdict on one read batch: one event with the jobs it takes (oldest
        first), a reason to refuse the whole batch (queue mode: every job refused), or None
        (completion mode: no completion of a watched name).  Queue mode notes on each job who
        took or refused it, for :meth:`QueueModeProducer.advance`."""
        if isinstance(raw, CompletionBatch):
            mine = [c for c in raw.completions if self.job_names is None or c.name in self.job_names]
            return TriggerEvent(raw.payload(mine)) if mine else None
        taken: list[QueueJob] = []
        for job in raw.jobs:
            reason = self.refusal(job)
            if reason is None:
                job.accepted += 1
                taken.append(job)
            else:
                job.reject_reasons.append(reason)
                self.log.warning("queue %s: refusing job %s: %s", self.queue_name, job.job_id, reason)
        if taken:
            return TriggerEvent(raw.payload(taken))
        return f"every job of the batch refused ({len(raw.jobs)})"

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            verdict = self.decide(raw)
            if isinstance(verdict, TriggerEvent):
                self.log.info(
                    "queue %s: %d job(s) in one asset event (%s mode)",
                    self.queue_name,
                    verdict.payload["count"],
                    self.mode,
                )
                yield verdict
            elif verdict is not None:
                reject_shared_stream_event()

    # -- standalone ----------------------------------------------------------------------------------
    async def run(self) -> AsyncIterator[TriggerEvent]:
        """The producer and this filter in one loop, for use outside the triggerer's shared-stream
        manager: a batch is advanced once the caller asks for the next event."""
        producer = self.create_shared_stream_producer(self.serialize()[1])
        try:
            async with contextlib.aclosing(producer.open_stream()) as stream:
                async for raw, broker_payload in stream:
                    verdict = self.decide(raw)
                    if isinstance(verdict, TriggerEvent):
                        yield verdict
                        outcome = AdvanceOutcome(acked=1, failed=0)
                    elif verdict is not None:
                        outcome = AdvanceOutcome(acked=0, failed=0, rejected=1)
                    else:
                        outcome = AdvanceOutcome(acked=1, failed=0)
                    await producer.advance([AdvanceItem(broker_payload, outcome)])
        finally:
            await producer.aclose()
