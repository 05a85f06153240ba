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
    only in ``advance``, after the asset events were saved.  Entries
    still pending when the triggerer dies are re-read from the consumer's pending list when
    the watcher starts again; entries pending for other, dead consumers are claimed after
    ``claim_min_idle_ms``.  Every redelivery counts as an attempt, and the arrival gate
    dead-letters a job whose attempts are exhausted, so duplicates stay bounded.  Jobs a
    watcher refuses (its ``job_names`` do not include the job's name, or the job's data is not
    JSON-compatible) go to the DLQ with reason ``unrecoverable`` and a ``detail`` saying why,
    unless another watcher of the same queue accepted them.

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

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

try:
    from airflow.triggers.shared_stream import (
        AdvanceItem,
        AdvanceOutcome,
        SharedStreamProducer,
        reject_shared_stream_event,
    )
except ImportError as exc:  # pragma: no cover - Airflow < 3.3
    raise AirflowOptionalProviderFeatureException(
        "Chasqui event-driven triggers need Airflow 3.3+ (airflow.triggers.shared_stream)"
    ) from exc

from ..core.calls import Call, command, str_reply
from ..core.codec import now_ms
from ..core.consumer import UNRECOVERABLE, CompleteRow, ConsumerCore
from ..core.event_follow import EventCursor, is_stream_id, stream_id
from ..core.features import Features
from ..core.keys import DEFAULT_GROUP, QueueKeys, validate_queue_name
from ..core.retry import RetryPolicy
from ..core.settings import QueueSettings
from ..core.urls import WAIT_BLOCK_MS
from ..engine.events import parse_event
from ..engine.group import GroupConsumer, Row
from ..engine.leader import TRANSIENT
from ..engine.promoter import Promoter
from ..engine.queue import Queue
from ..errors import ChasquiConnectionError, CodecError, ConfigError, ScriptError
from ..hooks.chasqui import ChasquiHook
from .job import json_safe_problem

__all__ = [
    "ChasquiQueueEventTrigger",
    "QueueModeProducer",
    "CompletionModeProducer",
    "QueueBatch",
    "CompletionBatch",
    "DEFAULT_MAX_BATCH",
    "MODES",
    "WATCHER_CONSUMER",
    "default_cursor",
]

log = logging.getLogger(__name__)

MODES = ("queue", "completion")
WATCHER_CONSUMER = "airflow-asset-watcher"
MAX_ATTEMPTS = 25  # as a worker's default: a job's own ``attempts`` override wins
_TRANSIENT = (*TRANSIENT, ChasquiConnectionError)
_MAX_BACKOFF_SECS = 5.0
_ADVANCE_TRIES = 3
DEFAULT_MAX_BATCH = 100
MAX_BATCH_LIMIT = 1000  # an asset event's ``extra`` is one JSON value in the metadata database
DEFAULT_LINGER_MS = 100
_MAX_COLLECT_SECS = 1.0  # a batch stops growing after this long, even if jobs keep arriving


def default_cursor(job_names: Sequence[str] | None) -> str:
    """The completion-mode cursor name when none is given: one per set of watched names."""
    label = ",".join(job_names) if job_names else "*"
    if len(label) <= 64 and not set(label) & set("{}\r\n\0"):
        return "airflow:" + label
    return "airflow:" + hashlib.sha1(label.encode("utf-8")).hexdigest()[:16]


def _backoff(failures: int) -> float:
    return min(0.2 * 2.0 ** min(failures, 5), _MAX_BACKOFF_SECS)


async def _open_queue(conn_id: str, queue_name: str) -> Queue:
    return await ChasquiHook(conn_id).aget_queue(queue_name)


class _Flow:
    """Back-pressure shared by both producers: at most ``limit`` batches yielded and not yet
    advanced.  Both use 1: a batch is read only once Airflow saved the previous one, so a burst
    that arrives meanwhile becomes one event, and events reach the metadata database in order
    and at least one triggerer sync apart (what keeps Airflow 3.3's asset scheduling from
    stranding them, see the module documentation).  ``gap_ms`` more after each advance widens
    that spacing for a slow scheduler."""

    def __init__(self, limit: int = 1, gap_ms: int = 0) -> None:
        self.limit = limit
        self.gap = gap_ms / 1000
        self.outstanding = 0
        self._room = asyncio.Event()
        self._ready_at = 0.0

    async def wait_for_room(self, timeout: float) -> bool:
        if self.outstanding >= self.limit:
            self._room.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._room.wait(), timeout)
            if self.outstanding >= self.limit:
                return False
        wait = self._ready_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(min(wait, timeout))
            return time.monotonic() >= self._ready_at
        return True

    def release(self, n: int) -> None:
        self.outstanding = max(0, self.outstanding - n)
        self._ready_at = time.monotonic() + self.gap
        self._room.set()


# ---- raw events (in-process only: they never leave the triggerer) ----------------------------
@dataclass(eq=False)
class QueueJob:
    """One job read from the queue (a member of a :class:`QueueBatch`)."""

    queue: str
    entry_id: bytes
    job_id: str
    name: str
    data: Any
    attempt: int
    created_at_ms: int
    raw: bytes = field(repr=False)
    read_ns: int = 0
    reject_reasons: list[str] = field(default_factory=list)
    accepted: int = 0  # watchers that put it in their event
    raw_name: bytes = field(default=b"", repr=False)  # the original name bytes when not UTF-8 (for the DLQ)

    def payload(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "data": self.data,
            "attempt": self.attempt,
            "created_at_ms": self.created_at_ms,
            "entry_id": str_reply(self.entry_id),
        }


def _batch_payload(mode: str, queue: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"mode": mode, "queue": queue, "count": len(jobs), "jobs": jobs}


@dataclass(eq=False)
class QueueBatch:
    """The jobs of one read, oldest first: one raw event, its own ``broker_payload``, and at most
    one ``TriggerEvent`` per watcher."""

    queue: str
    jobs: list[QueueJob]

    def payload(self, jobs: Sequence[QueueJob] | None = None) -> dict[str, Any]:
        return _batch_payload("queue", self.queue, [job.payload() for job in (self.jobs if jobs is None else jobs)])


@dataclass(frozen=True)
class CompletedJob:
    """One ``completed`` entry of ``{chasqui:<q>}:events`` (the producer passes no other kind)."""

    queue: str
    event_id: str
    event: str
    job_id: str
    name: str
    ts_ms: int
    fields: dict[str, str]

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "event": self.event,
            "job_id": self.job_id,
            "name": self.name,
            "ts_ms": self.ts_ms,
            "event_id": self.event_id,
        }
        for key in ("attempt", "duration_us"):
            value = self.fields.get(key, "")
            out[key] = int(value) if value.isdigit() else None
        return out


@dataclass(frozen=True)
class CompletionBatch:
    """The ``completed`` entries of one read of the events stream, oldest first; ``through`` is
    the last stream id read (the cursor's value once the batch is saved)."""

    queue: str
    completions: list[CompletedJob]
    through: str

    def payload(self, completions: Sequence[CompletedJob] | None = None) -> dict[str, Any]:
        chosen = self.completions if completions is None else completions
        return _batch_payload("completion", self.queue, [c.payload() for c in chosen])


def _check_batching(max_batch: Any, linger_ms: Any, event_gap_ms: Any = 0) -> None:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= MAX_BATCH_LIMIT:
        raise ValueError(f"max_batch must be an integer from 1 to {MAX_BATCH_LIMIT}, got {max_batch!r}")
    if isinstance(linger_ms, bool) or not isinstance(linger_ms, int) or not 0 <= linger_ms <= 5000:
        raise ValueError(f"linger_ms must be an integer from 0 to 5000, got {linger_ms!r}")
    if isinstance(event_gap_ms, bool) or not isinstance(event_gap_ms, int) or not 0 <= event_gap_ms <= 600_000:
        raise ValueError(f"event_gap_ms must be an integer from 0 to 600000, got {event_gap_ms!r}")


# ---- queue mode ---------------------------------------------------------------------------------
class QueueModeProducer(SharedStreamProducer):
    """Reads a queue as its consumer (group ``default``, consumer ``airflow-asset-watcher``) in
    batches of at most ``max_batch`` jobs and acknowledges or dead-letters them in
    :meth:`advance` only.

    A batch is what one collection finds: the watcher's own entries left pending by an earlier
    run, entries due for redelivery, idle entries of dead consumers, then new entries; after the
    first entry it keeps reading while more arrive within ``linger_ms`` (up to ``max_batch`` and
    about a second), so a burst sent in one go is one batch.  The next batch is read only after
    this one was advanced (and ``event_gap_ms`` more).  Entries resolved with a failure (ack
    timeout, subscriber overflow) or that no subscriber received stay pending and are re-read
    after ``redeliver_after_ms``.
    """

    def __init__(
        self,
        *,
        queue_name: str,
        chasqui_conn_id: str,
        max_batch: int = DEFAULT_MAX_BATCH,
        linger_ms: int = DEFAULT_LINGER_MS,
        event_gap_ms: int = 0,
        block_ms: int = 1000,
        claim_min_idle_ms: int = 30_000,
        redeliver_after_ms: int = 1000,
        promote: bool = True,
    ) -> None:
        _check_batching(max_batch, linger_ms, event_gap_ms)
        self.queue_name = validate_queue_name(queue_name)
        self.chasqui_conn_id = chasqui_conn_id
        self.max_batch = max_batch
        self.linger_ms = linger_ms
        self.block_ms = min(block_ms, WAIT_BLOCK_MS)  # a read must end within the Queue's socket timeout
        self.claim_min_idle_ms = claim_min_idle_ms
        self.redeliver_after_ms = redeliver_after_ms
        self.promote = promote
        self.settings = QueueSettings()
        self.keys = QueueKeys.for_queue(queue_name)
        self.core = ConsumerCore(
            queue_name,
            group=DEFAULT_GROUP,
            consumer_id=WATCHER_CONSUMER,
            max_attempts=MAX_ATTEMPTS,
            settings=self.settings,
            retry=RetryPolicy(),
            events=True,
            result_ttl_ms=0,
            failure_ttl_ms=24 * 3600 * 1000,
        )
        self.flow = _Flow(gap_ms=event_gap_ms)
        self._queue: Queue | None = None
        self._group: GroupConsumer | None = None
        self._features: Features | None = None
        self._promoter: Promoter | None = None
        self._promoter_task: asyncio.Task[None] | None = None
        self._in_flight: dict[bytes, QueueJob] = {}
        self._held: dict[bytes, tuple[float, int]] = {}  # entry id -> (redeliver at, deliveries so far)
        self._own_backlog = True  # our pending list from an earlier run still to be re-read
        self._own_after = "-"
        self._next_recovery = 0.0
        self.acked_total = 0
        self.dead_lettered_total = 0
        self.batches_total = 0

    # -- reading ---------------------------------------------------------------------------------
    async def open_stream(self) -> AsyncGenerator[tuple[QueueBatch, QueueBatch], None]:
        self._queue = await _open_queue(self.chasqui_conn_id, self.queue_name)
        failures = 0
        ready = False
        self._next_recovery = time.monotonic() + self.claim_min_idle_ms / 2000
        while True:
            try:
                if not ready:
                    await self._prepare()
                    ready = True
                if not await self.flow.wait_for_room(self.block_ms / 1000):
                    continue
                jobs = await self._admit(await self._collect())
                failures = 0
            except _TRANSIENT as exc:
                failures += 1
                delay = _backoff(failures)
                log.warning(
                    "chasqui watcher of queue %s: Redis unavailable (%s); retrying in %.1f s",
                    self.queue_name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if not jobs:
                continue
            jobs.sort(key=lambda job: stream_id(str_reply(job.entry_id)))  # oldest first
            for job in jobs:
                self._in_flight[job.entry_id] = job
            self.flow.outstanding += 1
            self.batches_total += 1
            batch = QueueBatch(self.queue_name, jobs)
            log.debug("chasqui watcher of queue %s: batch of %d job(s)", self.queue_name, len(jobs))
            yield batch, batch

    async def _collect(self) -> list[tuple[bytes, Any, int]]:
        """One batch of entries, at most ``max_batch``: what is owed first (our own backlog,
        redeliveries, idle entries of dead consumers), then new entries, lingering while more
        arrive."""
        rows: list[tuple[bytes, Any, int]] = []
        if self._own_backlog:
            rows += await self._own_pending(self.max_batch)
        if len(rows) < self.max_batch and self._due_held():
            rows += await self._reclaim_held(self.max_batch - len(rows))
        if len(rows) < self.max_batch and time.monotonic() >= self._next_recovery:
            self._next_recovery = time.monotonic() + self.claim_min_idle_ms / 2000
            rows += await self._recover_idle(self.max_batch - len(rows))
        if len(rows) < self.max_batch:
            rows += await self._read_new(self.max_batch - len(rows), None if rows else self.block_ms)
        stop = time.monotonic() + _MAX_COLLECT_SECS
        while rows and len(rows) < self.max_batch and time.monotonic() < stop:
            more = await self._read_new(self.max_batch - len(rows), self.linger_ms or None)
            if not more:
                break
            rows += more
        return rows

    async def _prepare(self) -> None:
        assert self._queue is not None
        driver = self._queue.driver
        self._group = GroupConsumer(driver, self.core)
        await self._group.ensure_group()
        self._features = await driver.features()
        if self.promote and self._promoter_task is None:
            self._promoter = Promoter(driver, self.queue_name, poll_interval_ms=250)
            self._promoter_task = asyncio.create_task(self._promoter.run(), name=f"chasqui-promoter[{self.queue_name}]")
        log.info("chasqui watcher reading queue %s as %s/%s", self.queue_name, DEFAULT_GROUP, WATCHER_CONSUMER)

    def _holding(self) -> set[bytes]:
        """Entries in flight or waiting for redelivery: a claim must not deliver them again."""
        return self._in_flight.keys() | self._held.keys()

    async def _own_pending(self, want: int) -> list[Row]:
        """Our consumer's pending entries left by an earlier run (a crash, a restart): re-read
        them first, oldest first, each a new delivery."""
        assert self._group is not None
        batch, cursor = await self._group.claim_own(self._own_after, want, self._holding())
        if cursor is None:
            self._own_backlog = False
        else:
            self._own_after = cursor
        if batch:
            log.info(
                "chasqui watcher of queue %s re-reads %d entries left pending by an earlier run",
                self.queue_name,
                len(batch),
            )
        return batch

    def _due_held(self) -> bool:
        now = time.monotonic()
        return any(at <= now for at, _ in self._held.values())

    async def _reclaim_held(self, want: int) -> list[Row]:
        assert self._group is not None
        now = time.monotonic()
        due = [eid for eid, (at, _) in self._held.items() if at <= now][:want]
        return await self._group.claim_again({eid: self._held.pop(eid)[1] for eid in due})

    async def _recover_idle(self, want: int) -> list[Row]:
        """Entries pending for another consumer (a dead one) longer than ``claim_min_idle_ms``."""
        assert self._group is not None
        batch = await self._group.claim_idle(self.claim_min_idle_ms, want, self._holding())
        if batch:
            log.info("chasqui watcher of queue %s claimed %d idle entries", self.queue_name, len(batch))
        return batch

    async def _read_new(self, want: int, block_ms: int | None) -> list[Row]:
        """New entries; ``block_ms`` None reads without waiting."""
        assert self._group is not None
        return await self._group.read_new(want, block_ms)

    async def _admit(self, batch: list[tuple[bytes, Any, int]]) -> list[QueueJob]:
        """The worker's arrival gate: malformed, oversize, undecodable and exhausted entries go
        straight to the DLQ (one round trip); the rest become raw events."""
        if not batch:
            return []
        assert self._queue is not None and self._features is not None
        now = now_ms()
        gated, rejected = self.core.gate_rows(batch)
        ready = []
        for dl in gated:  # the asset event carries the data: decoded here, bounded (codec.decode_data)
            try:
                dl.payload()
            except CodecError as exc:
                rejected.append(self.core.undecodable(dl, exc))
            else:
                ready.append(dl)
        for r in rejected:
            log.warning(
                "chasqui watcher of queue %s dead-letters entry %s: %s %s",
                self.queue_name,
                str_reply(r.entry_id),
                r.reason,
                r.detail,
            )
        dead = [self.core.reject(r, self._features, now) for r in rejected]
        jobs = [
            QueueJob(
                self.queue_name,
                dl.entry_id,
                dl.envelope.id,
                dl.name,
                dl.data,
                dl.delivery_count,
                dl.envelope.created_at_ms,
                dl.raw,
                time.monotonic_ns(),
                raw_name=dl.raw_name,
            )
            for dl in ready
        ]
        if dead:
            await self._queue.driver.pipeline(dead)
            self.dead_lettered_total += len(dead)
        return jobs

    # -- advancing -------------------------------------------------------------------------------
    def get_advance_lane(self, broker_payload: QueueBatch) -> Hashable:
        """One lane: a single batch is in flight at a time anyway."""
        return "batches"

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Acknowledge what Airflow saved; dead-letter what every watcher refused; hold the rest.

        Per read batch (one raw event):

        * failed by a subscriber (ack timeout, overflow) or received by none: every job stays
          pending and is re-read after ``redeliver_after_ms`` (a new delivery, so attempts bound
          the loop);
        * otherwise, per job: put in a saved event by at least one watcher: XACK + XDEL (one
          ``complete_batch`` call for the whole batch, which also writes ``completed``
          events); refused by every watcher that looked at it: DLQ, reason ``unrecoverable``,
          ``detail`` = the watchers' reasons; looked at by none (a watcher left before reading
          it): held for redelivery.
        """
        if self._queue is None or self._features is None:
            raise RuntimeError(f"queue {self.queue_name}: advance() before open_stream() opened Redis")
        now, now_ns = now_ms(), time.monotonic_ns()
        done: list[CompleteRow] = []
        dead: list[Call] = []
        held_at = time.monotonic() + self.redeliver_after_ms / 1000
        for item in batch:
            read: QueueBatch = item.broker_payload
            outcome: AdvanceOutcome = item.outcome
            whole_batch_held = bool(outcome.failed or (outcome.acked == 0 and outcome.rejected == 0))
            if whole_batch_held:
                log.warning(
                    "chasqui watcher of queue %s: batch of %d job(s) not taken by every watcher (%s); redelivering",
                    self.queue_name,
                    len(read.jobs),
                    outcome,
                )
            for job in read.jobs:
                if whole_batch_held or (not job.accepted and not job.reject_reasons):
                    self._held[job.entry_id] = (held_at, job.attempt)
                elif job.accepted:
                    if job.reject_reasons:
                        log.info(
                            "job %s of queue %s: accepted by %d watcher(s), refused by %d (%s)",
                            job.job_id,
                            self.queue_name,
                            job.accepted,
                            len(job.reject_reasons),
                            "; ".join(job.reject_reasons),
                        )
                    done.append(
                        (job.entry_id, job.job_id, job.name, job.attempt, max(0, (now_ns - job.read_ns) // 1000), b"")
                    )
                else:
                    detail = "; ".join(dict.fromkeys(job.reject_reasons)) or "refused by the Airflow asset watcher"
                    dead.append(
                        self.core.dead_letter(
                            job.entry_id,
                            UNRECOVERABLE,
                            job.raw,
                            job.name,
                            detail[:500],
                            job.job_id,
                            job.attempt,
                            self._features,
                            now,
                            dlq_name=job.raw_name,
                        )
                    )
        if done or dead:
            await self._settle(done, dead, self._features, now)
        for item in batch:
            for job in item.broker_payload.jobs:
                self._in_flight.pop(job.entry_id, None)
        self.acked_total += len(done)
        self.dead_lettered_total += len(dead)
        self.flow.release(len(batch))

    async def _settle(self, done: list[CompleteRow], dead: list[Call], features: Features, now: int) -> None:
        """One round trip; a lost connection is retried (see :meth:`GroupConsumer.settle`)."""
        assert self._group is not None
        for attempt in range(1, _ADVANCE_TRIES + 1):
            try:
                await self._group.settle(done, dead, features, now)
                return
            except _TRANSIENT as exc:
                if attempt == _ADVANCE_TRIES:
                    raise
                log.warning("queue %s: acknowledging failed (%s); retrying", self.queue_name, exc)
                await asyncio.sleep(_backoff(attempt))

    async def aclose(self) -> None:
        promoter, task = self._promoter, self._promoter_task
        self._promoter = self._promoter_task = None
        if promoter is not None and task is not None:
            promoter.stop()
            try:
                await asyncio.wait_for(task, 5)
            except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001 - best effort
                task.cancel()
        queue, self._queue = self._queue, None
        if queue is not None:
            await queue.close()


# ---- completion mode ----------------------------------------------------------------------------
class CompletionModeProducer(SharedStreamProducer):
    """Follows ``{chasqui:<q>}:events`` from a cursor kept in Redis and yields its ``completed``
    entries in batches of at most ``max_batch`` (lingering as the queue mode does);
    :meth:`advance` moves the cursor to the end of a resolved batch.  A failed or unreceived
    batch keeps the cursor where it was and is re-read from it after ``reread_after_ms``
    (like a Kafka seek)."""

    def __init__(
        self,
        *,
        queue_name: str,
        chasqui_conn_id: str,
        cursor: str,
        max_batch: int = DEFAULT_MAX_BATCH,
        linger_ms: int = DEFAULT_LINGER_MS,
        event_gap_ms: int = 0,
        block_ms: int = 1000,
        reread_after_ms: int = 1000,
    ) -> None:
        _check_batching(max_batch, linger_ms, event_gap_ms)
        self.queue_name = validate_queue_name(queue_name)
        self.chasqui_conn_id = chasqui_conn_id
        self.cursor = cursor
        self.keys = QueueKeys.for_queue(queue_name)
        self.cursor_key = self.keys.cursor(cursor)
        self.max_batch = max_batch
        self.linger_ms = linger_ms
        self.block_ms = min(block_ms, WAIT_BLOCK_MS)  # a read must end within the Queue's socket timeout
        self.reread_after_ms = reread_after_ms
        self.flow = _Flow(gap_ms=event_gap_ms)
        self._queue: Queue | None = None
        self.committed = ""  # the cursor's value: every event up to it was saved by Airflow
        self.events = EventCursor(self.keys, count=max_batch, block_ms=self.block_ms)  # what was read
        self._seek_at: float | None = None
        self.batches_total = 0

    async def open_stream(self) -> AsyncGenerator[tuple[CompletionBatch, str], None]:
        self._queue = await _open_queue(self.chasqui_conn_id, self.queue_name)
        failures = 0
        loaded = False
        while True:
            try:
                if not loaded:
                    await self._load_cursor()
                    loaded = True
                if self._seek_at is not None:
                    wait = self._seek_at - time.monotonic()
                    if wait > 0:  # read nothing past the held batch until the re-read
                        await asyncio.sleep(min(wait, self.block_ms / 1000))
                        continue
                    self._seek_at = None
                    log.info(
                        "chasqui watcher of %s events: re-reading after cursor %s", self.queue_name, self.committed
                    )
                    self.events.seek(self.committed)
                if not await self.flow.wait_for_room(self.block_ms / 1000):
                    continue
                completions = await self._collect()
                failures = 0
            except _TRANSIENT as exc:
                failures += 1
                delay = _backoff(failures)
                log.warning(
                    "chasqui watcher of %s events: Redis unavailable (%s); retrying in %.1f s",
                    self.queue_name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            if not completions:  # nothing any watcher fires on; a later commit covers it
                continue
            self.flow.outstanding += 1
            self.batches_total += 1
            through = self.events.position
            yield CompletionBatch(self.queue_name, completions, through), through

    async def _collect(self) -> list[CompletedJob]:
        """The ``completed`` entries after the position of ``events``, at most ``max_batch``;
        after the first one, reads on while more arrive within ``linger_ms``.  The position ends
        at the last entry read."""
        assert self._queue is not None
        out: list[CompletedJob] = []
        block: int | None = self.block_ms
        stop: float | None = None
        while len(out) < self.max_batch:
            rows = await self._queue.driver.call(self.events.read_call(self.max_batch - len(out), block))
            read = 0
            for entry_id, flat in self.events.consume(rows):
                read += 1
                ev = parse_event(entry_id, flat)
                if ev.name == "completed":
                    out.append(
                        CompletedJob(
                            self.queue_name,
                            ev.event_id,
                            ev.name,
                            ev.job_id or "",
                            ev.job_name,
                            ev.ts_ms,
                            dict(ev.fields),
                        )
                    )
            if not out:
                break  # only other kinds of events so far: the caller reads again
            stop = stop or time.monotonic() + _MAX_COLLECT_SECS
            if not read or time.monotonic() >= stop:
                break
            block = self.linger_ms or None
        return out

    async def _load_cursor(self) -> None:
        """Create the cursor at the stream's end if absent (so a restart before the first event
        cannot skip what arrived meanwhile), then start after it."""
        assert self._queue is not None
        driver, events = self._queue.driver, self.events
        start = events.pin(await driver.call(events.pin_call()))
        await driver.call(command("SET", self.cursor_key, start, "NX"))
        value = str_reply(await driver.call(command("GET", self.cursor_key)) or b"")
        if not is_stream_id(value):
            raise ConfigError(
                f"cursor {self.cursor_key} holds {value!r}, not a stream id; delete it to restart "
                "from the end of the events stream"
            )
        events.seek(value)
        self.committed = value
        try:
            lost = events.trimmed(await driver.call(events.trim_call()))
        except ScriptError:  # no events stream yet
            lost = None
        if lost is not None:
            log.warning(
                "chasqui watcher of %s events: events after cursor %s, ids %s, were trimmed from %s "
                "before they were read; raise the events stream's MAXLEN or keep the watcher running",
                self.queue_name,
                value,
                lost,
                self.keys.events,
            )
        log.info("chasqui watcher of %s events starts after %s (cursor %s)", self.queue_name, value, self.cursor_key)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Commit the cursor to the end of the resolved batch; after a failed or unreceived one,
        re-read from the cursor (nothing later was read: one batch is in flight at a time)."""
        if self._queue is None:
            raise RuntimeError(f"queue {self.queue_name}: advance() before open_stream() opened Redis")
        through: str | None = None
        for item in batch:
            outcome: AdvanceOutcome = item.outcome
            if outcome.failed or (outcome.acked == 0 and outcome.rejected == 0):
                log.warning(
                    "chasqui watcher of %s events: batch through %s not taken by every watcher (%s); "
                    "re-reading from %s",
                    self.queue_name,
                    item.broker_payload,
                    outcome,
                    self.committed,
                )
                self._seek_at = time.monotonic() + self.reread_after_ms / 1000
                break
            through = item.broker_payload
        if through is not None and stream_id(through) > stream_id(self.committed):
            await self._commit(through)
        self.flow.release(len(batch))

    async def _commit(self, event_id: str) -> None:
        assert self._queue is not None
        for attempt in range(1, _ADVANCE_TRIES + 1):
            try:
                await self._queue.driver.call(command("SET", self.cursor_key, event_id))
                break
            except _TRANSIENT as exc:
                if attempt == _ADVANCE_TRIES:
                    raise
                log.warning("cursor %s: write failed (%s); retrying", self.cursor_key, exc)
                await asyncio.sleep(_backoff(attempt))
        self.committed = event_id

    async def aclose(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            await queue.close()


# ---- the trigger --------------------------------------------------------------------------------
def _names(job_names: Any) -> list[str] | None:
    if job_names is None:
        return None
    if isinstance(job_names, str) or not isinstance(job_names, (list, tuple, set, frozenset)):
        raise ValueError(f"job_names must be a list of job names or None, got {job_names!r}")
    names = sorted(set(job_names))
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"job_names must hold non-empty strings, got {job_names!r}")
    return names


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
        if not isinstance(chasqui_conn_id, str) or not chasqui_conn_id:
            raise ValueError(f"chasqui_conn_id must be a connection id, got {chasqui_conn_id!r}")
        _check_batching(max_batch, linger_ms, event_gap_ms)
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
