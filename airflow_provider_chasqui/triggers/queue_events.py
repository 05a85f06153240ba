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

``mode="queue"`` -- the jobs of a queue become asset events.
    The producer is a consumer of the queue in ChasquiMQ's consumer group ``default`` (the
    group chasqui and ChasquiMQ workers read), under the consumer name
    ``airflow-asset-watcher``.  A separate group cannot work: ChasquiMQ acknowledges with
    XACK + XDEL, so a job finished by one group vanishes from every other group.  The
    watcher therefore *is* a worker of that queue: give it a queue of its own (a chasqui
    worker on the same queue would take some of the jobs).  It also runs the queue's
    delayed-job promoter (leader-locked, as in every worker), so delayed jobs arrive.
    An entry is acknowledged (``complete_batch``: XACK + XDEL, or XACKDEL on Redis 8.2+, and
    a ``completed`` event) only in ``advance``, after the asset events were saved.  Entries
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
    ``job_names`` (any name when None).  Its position is a cursor in Redis,
    ``{chasqui:<q>}:cursor:<cursor>``, written in ``advance`` only after the events up to it
    were saved: a restarted triggerer resumes right after the last saved event, so nothing is
    skipped, and the only replay possible is of events saved in the last instant before a
    crash or shutdown (saved, but the confirmation had not reached the triggerer yet).  A new
    cursor starts at the end of the stream.  Events trimmed from the stream (``MAXLEN``)
    before the watcher read them are reported in the triggerer log.

Payloads are JSON-safe dicts; ``job_id`` plus ``entry_id`` (queue) or ``event_id``
(completion) identify an entry, so a DAG can drop a rare duplicate.  Outside the triggerer's
shared-stream manager, ``run()`` drives the same producer itself and acknowledges an entry
when the caller asks for the next event (not gated on the database).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException
from airflow.triggers.base import BaseEventTrigger, TriggerEvent
from redis import exceptions as rexc

try:
    from airflow.triggers.shared_stream import (
        AdvanceItem,
        AdvanceOutcome,
        SharedStreamProducer,
        reject_shared_stream_event,
    )
except ImportError as exc:  # pragma: no cover - Airflow < 3.3
    raise AirflowOptionalProviderFeatureException(
        "Chasqui event-driven triggers need Airflow 3.3+ (airflow.triggers.shared_stream)") from exc

from ..core.calls import Call, command, int_reply, str_reply
from ..core.codec import now_ms
from ..core.consumer import UNRECOVERABLE, ConsumerCore, Delivery, Rejected
from ..core.features import Features
from ..core.keys import DEFAULT_GROUP, QueueKeys, validate_queue_name
from ..core.retry import RetryPolicy
from ..core.settings import QueueSettings
from ..core.urls import WAIT_BLOCK_MS
from ..engine.events import parse_event
from ..engine.leader import TRANSIENT
from ..engine.promoter import Promoter
from ..engine.queue import Queue
from ..errors import ChasquiConnectionError, ConfigError
from ..hooks.chasqui import ChasquiHook
from .job import json_safe_problem

__all__ = [
    "ChasquiQueueEventTrigger",
    "QueueModeProducer",
    "CompletionModeProducer",
    "MODES",
    "WATCHER_CONSUMER",
    "default_cursor",
]

log = logging.getLogger(__name__)

MODES = ("queue", "completion")
WATCHER_CONSUMER = "airflow-asset-watcher"
MAX_ATTEMPTS = 25  # as a worker's default: a job's own ``attempts`` override wins
_TRANSIENT = (*TRANSIENT, ChasquiConnectionError)
_STREAM_ID = re.compile(r"^\d+-\d+$")
_MAX_BACKOFF_SECS = 5.0
_ADVANCE_TRIES = 3


def _stream_id(value: str) -> tuple[int, int]:
    ms, _, seq = value.partition("-")
    return int(ms), int(seq)


def default_cursor(job_names: Sequence[str] | None) -> str:
    """The completion-mode cursor name when none is given: one per set of watched names."""
    label = ",".join(job_names) if job_names else "*"
    if len(label) <= 64 and not set(label) & set("{}\r\n\0"):
        return "airflow:" + label
    return "airflow:" + hashlib.sha1(label.encode("utf-8")).hexdigest()[:16]


def _backoff(failures: int) -> float:
    return min(0.2 * 2 ** min(failures, 5), _MAX_BACKOFF_SECS)


async def _open_queue(conn_id: str, queue_name: str) -> Queue:
    return await ChasquiHook(conn_id).aget_queue(queue_name)


def _room_limit() -> int:
    """Entries in flight per producer: half the triggerer's per-subscriber queue, so a backlog
    never overflows a subscriber (which Airflow fails instead of slowing down)."""
    try:
        from airflow.configuration import conf

        size = conf.getint("triggerer", "shared_stream_subscriber_queue_size", fallback=1024)
    except Exception:  # noqa: BLE001 - outside a configured Airflow: the default
        size = 1024
    return max(1, min(512, size // 2))


class _Flow:
    """Back-pressure shared by both producers: at most ``limit`` entries yielded and not yet
    advanced."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.outstanding = 0
        self._room = asyncio.Event()

    def room(self) -> int:
        return self.limit - self.outstanding

    async def wait_for_room(self, timeout: float) -> bool:
        if self.outstanding < self.limit:
            return True
        self._room.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._room.wait(), timeout)
        return self.outstanding < self.limit

    def release(self, n: int) -> None:
        self.outstanding = max(0, self.outstanding - n)
        self._room.set()


# ---- raw events (in-process only: they never leave the triggerer) ----------------------------
@dataclass(eq=False)
class QueueJob:
    """One job read from the queue; also the producer's ``broker_payload`` for it."""

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

    def payload(self) -> dict[str, Any]:
        return {"mode": "queue", "queue": self.queue, "job_id": self.job_id, "name": self.name, "data": self.data,
                "attempt": self.attempt, "created_at_ms": self.created_at_ms, "entry_id": str_reply(self.entry_id)}


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
        out: dict[str, Any] = {"mode": "completion", "queue": self.queue, "event": self.event,
                               "job_id": self.job_id, "name": self.name, "ts_ms": self.ts_ms,
                               "event_id": self.event_id}
        for key in ("attempt", "duration_us"):
            value = self.fields.get(key, "")
            out[key] = int(value) if value.isdigit() else None
        return out


# ---- queue mode ---------------------------------------------------------------------------------
class QueueModeProducer(SharedStreamProducer):
    """Reads a queue as its consumer (group ``default``, consumer ``airflow-asset-watcher``) and
    acknowledges or dead-letters entries in :meth:`advance` only.

    Entries resolved with a failure (ack timeout, subscriber overflow) or that no subscriber
    received stay pending and are re-read after ``redeliver_after_ms``.
    """

    def __init__(self, *, queue_name: str, chasqui_conn_id: str, read_count: int = 100, block_ms: int = 1000,
                 claim_min_idle_ms: int = 30_000, redeliver_after_ms: int = 1000, promote: bool = True,
                 max_in_flight: int | None = None) -> None:
        self.queue_name = validate_queue_name(queue_name)
        self.chasqui_conn_id = chasqui_conn_id
        self.read_count = read_count
        self.block_ms = min(block_ms, WAIT_BLOCK_MS)  # a read must end within the Queue's socket timeout
        self.claim_min_idle_ms = claim_min_idle_ms
        self.redeliver_after_ms = redeliver_after_ms
        self.promote = promote
        self.settings = QueueSettings()
        self.keys = QueueKeys.for_queue(queue_name)
        self.core = ConsumerCore(queue_name, group=DEFAULT_GROUP, consumer_id=WATCHER_CONSUMER,
                                 max_attempts=MAX_ATTEMPTS, settings=self.settings, retry=RetryPolicy(), events=True,
                                 result_ttl_ms=0, failure_ttl_ms=24 * 3600 * 1000)
        self.flow = _Flow(max_in_flight or _room_limit())
        self._queue: Queue | None = None
        self._features: Features | None = None
        self._promoter: Promoter | None = None
        self._promoter_task: asyncio.Task[None] | None = None
        self._in_flight: dict[bytes, QueueJob] = {}
        self._held: dict[bytes, tuple[float, int]] = {}  # entry id -> (redeliver at, deliveries so far)
        self._own_backlog = True  # our pending list from an earlier run still to be re-read
        self._own_after = "-"
        self.acked_total = 0
        self.dead_lettered_total = 0

    # -- reading ---------------------------------------------------------------------------------
    async def open_stream(self) -> AsyncIterator[tuple[QueueJob, QueueJob]]:
        self._queue = await _open_queue(self.chasqui_conn_id, self.queue_name)
        failures = 0
        ready = False
        next_recovery = time.monotonic() + self.claim_min_idle_ms / 2000
        while True:
            try:
                if not ready:
                    await self._prepare()
                    ready = True
                if not await self.flow.wait_for_room(self.block_ms / 1000):
                    continue
                if self._own_backlog:
                    batch = await self._own_pending()
                elif self._due_held():
                    batch = await self._reclaim_held()
                elif time.monotonic() >= next_recovery:
                    next_recovery = time.monotonic() + self.claim_min_idle_ms / 2000
                    batch = await self._recover_idle()
                else:
                    batch = await self._read_new()
                jobs = await self._admit(batch)
                failures = 0
            except _TRANSIENT as exc:
                failures += 1
                delay = _backoff(failures)
                log.warning("chasqui watcher of queue %s: Redis unavailable (%s); retrying in %.1f s",
                            self.queue_name, exc, delay)
                await asyncio.sleep(delay)
                continue
            for job in jobs:
                self._in_flight[job.entry_id] = job
                self.flow.outstanding += 1
                yield job, job

    async def _prepare(self) -> None:
        assert self._queue is not None
        driver = self._queue.driver
        try:
            await driver.call(self.core.create_group())
        except rexc.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._features = await driver.features()
        if self.promote and self._promoter_task is None:
            self._promoter = Promoter(driver, self.queue_name, poll_interval_ms=250)
            self._promoter_task = asyncio.create_task(self._promoter.run(), name=f"chasqui-promoter[{self.queue_name}]")
        log.info("chasqui watcher reading queue %s as %s/%s", self.queue_name, DEFAULT_GROUP, WATCHER_CONSUMER)

    def _room(self) -> int:
        return max(1, min(self.read_count, self.flow.room()))

    async def _own_pending(self) -> list[tuple[bytes, Any, int]]:
        """Our consumer's pending entries left by an earlier run (a crash, a restart): re-read
        them first, oldest first, each a new delivery."""
        assert self._queue is not None
        driver, want = self._queue.driver, self._room()
        rows = await driver.call(command("XPENDING", self.keys.stream, DEFAULT_GROUP, self._own_after, "+", want,
                                         WATCHER_CONSUMER))
        rows = rows or []
        if len(rows) < want:
            self._own_backlog = False
        if not rows:
            return []
        self._own_after = "(" + str_reply(rows[-1][0])
        counts = {row[0]: int_reply(row[3]) for row in rows
                  if row[0] not in self._in_flight and row[0] not in self._held}
        if not counts:
            return []
        claimed = await driver.call(command("XCLAIM", self.keys.stream, DEFAULT_GROUP, WATCHER_CONSUMER, 0,
                                            *counts))
        batch = [(eid, fields, counts.get(eid, 0) + 1) for eid, fields in claimed or [] if eid is not None]
        if batch:
            log.info("chasqui watcher of queue %s re-reads %d entries left pending by an earlier run",
                     self.queue_name, len(batch))
        return batch

    def _due_held(self) -> bool:
        now = time.monotonic()
        return any(at <= now for at, _ in self._held.values())

    async def _reclaim_held(self) -> list[tuple[bytes, Any, int]]:
        assert self._queue is not None
        now = time.monotonic()
        due = [eid for eid, (at, _) in self._held.items() if at <= now][: self._room()]
        counts = {eid: self._held.pop(eid)[1] for eid in due}
        claimed = await self._queue.driver.call(command("XCLAIM", self.keys.stream, DEFAULT_GROUP, WATCHER_CONSUMER,
                                                        0, *due))
        return [(eid, fields, counts.get(eid, 0) + 1) for eid, fields in claimed or [] if eid is not None]

    async def _recover_idle(self) -> list[tuple[bytes, Any, int]]:
        """Entries pending for another consumer (a dead one) longer than ``claim_min_idle_ms``."""
        assert self._queue is not None
        driver = self._queue.driver
        rows = await driver.call(self.core.idle_pending(self.claim_min_idle_ms, self._room()))
        counts = {row[0]: int_reply(row[3]) for row in rows or []
                  if row[0] not in self._in_flight and row[0] not in self._held}
        if not counts:
            return []
        claimed = await driver.call(self.core.claim(self.claim_min_idle_ms, list(counts)))
        batch = [(eid, fields, counts.get(eid, 0) + 1) for eid, fields in claimed or [] if eid is not None]
        if batch:
            log.info("chasqui watcher of queue %s claimed %d idle entries", self.queue_name, len(batch))
        return batch

    async def _read_new(self) -> list[tuple[bytes, Any, int]]:
        assert self._queue is not None
        rows = await self._queue.driver.call(self.core.read(self._room(), self.block_ms))
        return [(eid, fields, 1) for _stream, entries in rows or [] for eid, fields in entries]

    async def _admit(self, batch: list[tuple[bytes, Any, int]]) -> list[QueueJob]:
        """The worker's arrival gate: malformed, oversize, undecodable and exhausted entries go
        straight to the DLQ (one round trip); the rest become raw events."""
        if not batch:
            return []
        assert self._queue is not None and self._features is not None
        now, jobs, dead = now_ms(), [], []
        for entry_id, fields, count in batch:
            verdict = self.core.gate(entry_id, fields, count)
            if isinstance(verdict, Rejected):
                log.warning("chasqui watcher of queue %s dead-letters entry %s: %s %s", self.queue_name,
                            str_reply(entry_id), verdict.reason, verdict.detail)
                dead.append(self.core.reject(verdict, self._features, now))
                continue
            assert isinstance(verdict, Delivery)
            env = verdict.envelope
            jobs.append(QueueJob(self.queue_name, entry_id, env.id, verdict.name, verdict.data, count,
                                 env.created_at_ms, verdict.raw, time.monotonic_ns()))
        if dead:
            await self._queue.driver.pipeline(dead)
            self.dead_lettered_total += len(dead)
        return jobs

    # -- advancing -------------------------------------------------------------------------------
    def get_advance_lane(self, broker_payload: QueueJob) -> Hashable:
        """One lane per entry: acknowledgements are per entry (not cumulative like an offset),
        so an entry still waiting for Airflow (up to the ack timeout) holds back no other."""
        return broker_payload.entry_id

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Acknowledge what Airflow saved; dead-letter what every watcher refused; hold the rest.

        * accepted by at least one subscriber and failed by none: XACK + XDEL (one
          ``complete_batch`` call for the whole batch, which also writes ``completed`` events);
        * refused by every subscriber (``reject_shared_stream_event``): DLQ, reason
          ``unrecoverable``, ``detail`` = the watchers' reasons;
        * failed by a subscriber (ack timeout, overflow) or received by none: left pending and
          re-read after ``redeliver_after_ms`` (a new delivery, so attempts bound the loop).
        """
        if self._queue is None or self._features is None:
            raise RuntimeError(f"queue {self.queue_name}: advance() before open_stream() opened Redis")
        now, now_ns = now_ms(), time.monotonic_ns()
        done: list[tuple[bytes, str, str, int, int, bytes]] = []
        calls: list[Call] = []
        held_at = time.monotonic() + self.redeliver_after_ms / 1000
        for item in batch:
            job: QueueJob = item.broker_payload
            outcome: AdvanceOutcome = item.outcome
            if outcome.failed or (outcome.acked == 0 and outcome.rejected == 0):
                self._held[job.entry_id] = (held_at, job.attempt)
                log.warning("chasqui watcher of queue %s: job %s not taken by every watcher (%s); redelivering",
                            self.queue_name, job.job_id, outcome)
            elif outcome.acked:
                if outcome.rejected:
                    log.info("job %s of queue %s: accepted by %d watcher(s), refused by %d (%s)", job.job_id,
                             self.queue_name, outcome.acked, outcome.rejected, "; ".join(job.reject_reasons))
                done.append((job.entry_id, job.job_id, job.name, job.attempt,
                             max(0, (now_ns - job.read_ns) // 1000), b""))
            else:
                detail = "; ".join(dict.fromkeys(job.reject_reasons)) or "refused by the Airflow asset watcher"
                calls.append(self.core.dead_letter(job.entry_id, UNRECOVERABLE, job.raw, job.name, detail[:500],
                                                   job.job_id, job.attempt, self._features, now))
        if done:
            calls.insert(0, self.core.complete(done, self._features, now))
        if calls:
            await self._send(calls)
        for item in batch:
            self._in_flight.pop(item.broker_payload.entry_id, None)
        self.acked_total += len(done)
        self.dead_lettered_total += len(calls) - (1 if done else 0)
        self.flow.release(len(batch))

    async def _send(self, calls: list[Call]) -> None:
        """One round trip; a lost connection is retried (every call is idempotent: an entry no
        longer pending is neither acknowledged nor dead-lettered twice)."""
        assert self._queue is not None
        for attempt in range(1, _ADVANCE_TRIES + 1):
            try:
                await self._queue.driver.pipeline(calls)
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
            except (asyncio.TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001 - best effort
                task.cancel()
        queue, self._queue = self._queue, None
        if queue is not None:
            await queue.close()


# ---- completion mode ----------------------------------------------------------------------------
class CompletionModeProducer(SharedStreamProducer):
    """Follows ``{chasqui:<q>}:events`` from a cursor kept in Redis and yields its ``completed``
    entries; :meth:`advance` moves the cursor over the resolved prefix (one lane: the cursor is
    cumulative).  A failed or unreceived event holds the cursor below it and re-reads from the
    cursor after ``reread_after_ms`` (like a Kafka seek)."""

    def __init__(self, *, queue_name: str, chasqui_conn_id: str, cursor: str, read_count: int = 100,
                 block_ms: int = 1000, reread_after_ms: int = 1000, max_in_flight: int | None = None) -> None:
        self.queue_name = validate_queue_name(queue_name)
        self.chasqui_conn_id = chasqui_conn_id
        self.cursor = cursor
        self.keys = QueueKeys.for_queue(queue_name)
        self.cursor_key = self.keys.cursor(cursor)
        self.read_count = read_count
        self.block_ms = min(block_ms, WAIT_BLOCK_MS)  # a read must end within the Queue's socket timeout
        self.reread_after_ms = reread_after_ms
        self.flow = _Flow(max_in_flight or _room_limit())
        self._queue: Queue | None = None
        self.committed = ""  # the cursor's value: every event up to it was saved by Airflow
        self._read_from = ""
        self._floor: str | None = None  # lowest held event id, not yet re-read and saved
        self._seek_at: float | None = None

    async def open_stream(self) -> AsyncIterator[tuple[CompletedJob, str]]:
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
                    if wait > 0:  # read nothing past the held event until the re-read
                        await asyncio.sleep(min(wait, self.block_ms / 1000))
                        continue
                    self._seek_at = None
                    log.info("chasqui watcher of %s events: re-reading after cursor %s", self.queue_name,
                             self.committed)
                    self._read_from = self.committed
                if not await self.flow.wait_for_room(self.block_ms / 1000):
                    continue
                rows = await self._queue.driver.call(command(
                    "XREAD", "COUNT", max(1, min(self.read_count, self.flow.room())), "BLOCK", self.block_ms,
                    "STREAMS", self.keys.events, self._read_from))
                failures = 0
            except _TRANSIENT as exc:
                failures += 1
                delay = _backoff(failures)
                log.warning("chasqui watcher of %s events: Redis unavailable (%s); retrying in %.1f s",
                            self.queue_name, exc, delay)
                await asyncio.sleep(delay)
                continue
            for _stream, entries in rows or []:
                for entry_id, flat in entries:
                    if self._seek_at is not None:
                        break
                    ev = parse_event(entry_id, flat)
                    self._read_from = ev.event_id
                    if ev.name != "completed":  # no watcher fires on it; a later commit covers it
                        continue
                    self.flow.outstanding += 1
                    yield CompletedJob(self.queue_name, ev.event_id, ev.name, ev.job_id or "", ev.job_name,
                                       ev.ts_ms, dict(ev.fields)), ev.event_id

    async def _load_cursor(self) -> None:
        """Create the cursor at the stream's end if absent (so a restart before the first event
        cannot skip what arrived meanwhile), then start after it."""
        assert self._queue is not None
        driver = self._queue.driver
        last = await driver.call(command("XREVRANGE", self.keys.events, "+", "-", "COUNT", 1))
        start = str_reply(last[0][0]) if last else "0-0"
        await driver.call(command("SET", self.cursor_key, start, "NX"))
        value = str_reply(await driver.call(command("GET", self.cursor_key)) or b"")
        if not _STREAM_ID.match(value):
            raise ConfigError(f"cursor {self.cursor_key} holds {value!r}, not a stream id; delete it to restart "
                              "from the end of the events stream")
        self.committed = self._read_from = value
        try:
            info = await driver.call(command("XINFO", "STREAM", self.keys.events))
        except rexc.ResponseError:  # no events stream yet
            info = None
        fields = {str_reply(info[i]): info[i + 1] for i in range(0, len(info) - 1, 2)} if info else {}
        deleted = str_reply(fields.get("max-deleted-entry-id", b"0-0") or b"0-0")
        if _STREAM_ID.match(deleted) and _stream_id(deleted) > _stream_id(value):
            log.warning("chasqui watcher of %s events: events after cursor %s were trimmed from %s before they "
                        "were read (up to %s); raise the events stream's MAXLEN or keep the watcher running",
                        self.queue_name, value, self.keys.events, deleted)
        log.info("chasqui watcher of %s events starts after %s (cursor %s)", self.queue_name, value,
                 self.cursor_key)

    async def advance(self, batch: Sequence[AdvanceItem]) -> None:
        """Commit the cursor through the batch's resolved prefix, never past a held event."""
        if self._queue is None:
            raise RuntimeError(f"queue {self.queue_name}: advance() before open_stream() opened Redis")
        through: str | None = None
        held: str | None = None
        for item in batch:
            outcome: AdvanceOutcome = item.outcome
            if outcome.failed or (outcome.acked == 0 and outcome.rejected == 0):
                held = item.broker_payload
                break
            through = item.broker_payload
        first = _stream_id(batch[0].broker_payload)
        floor = self._floor
        if floor is not None and through is not None and first <= _stream_id(floor) <= _stream_id(through):
            floor = None  # the re-read got past the held event
        if held is not None:
            log.warning("chasqui watcher of %s events: event %s not taken by every watcher; re-reading from %s",
                        self.queue_name, held, self.committed)
            floor = held if floor is None or _stream_id(held) < _stream_id(floor) else floor
            self._seek_at = time.monotonic() + self.reread_after_ms / 1000
        self._floor = floor
        if through is not None and _stream_id(through) > _stream_id(self.committed) and (
                floor is None or _stream_id(through) < _stream_id(floor)):
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
    """Fires an asset event per job of a queue (``mode="queue"``) or per completed job
    (``mode="completion"``); see the module documentation for delivery guarantees.

    :param queue_name: the Chasqui queue.
    :param mode: ``"queue"`` (the watcher consumes the queue's jobs) or ``"completion"`` (it
        follows the queue's events stream and fires when jobs complete).
    :param job_names: only these job names (None = every name).  Queue mode dead-letters jobs of
        other names (as a worker without a handler does) unless another watcher takes them.
    :param chasqui_conn_id: the ``chasqui`` connection.
    :param cursor: completion mode only: the name of the cursor kept at
        ``{chasqui:<queue>}:cursor:<cursor>``; default ``airflow:<job names>`` (one per set of
        names).  Give each independent watcher of one queue its own cursor.
    """

    def __init__(self, *, queue_name: str, mode: str = "queue", job_names: list[str] | None = None,
                 chasqui_conn_id: str = ChasquiHook.default_conn_name, cursor: str | None = None) -> None:
        super().__init__()
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
                raise ValueError(f"cursor must be a non-empty name without braces or control characters, "
                                 f"got {cursor!r}")
        if not isinstance(chasqui_conn_id, str) or not chasqui_conn_id:
            raise ValueError(f"chasqui_conn_id must be a connection id, got {chasqui_conn_id!r}")
        self.queue_name = queue_name
        self.mode = mode
        self.job_names = _names(job_names)
        self.chasqui_conn_id = chasqui_conn_id
        self.cursor = cursor

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "queue_name": self.queue_name,
                "mode": self.mode,
                "job_names": None if self.job_names is None else list(self.job_names),
                "chasqui_conn_id": self.chasqui_conn_id,
                "cursor": self.cursor,
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
        completion mode per (connection, queue, cursor)."""
        if self.mode == "queue":
            return ("chasqui", "queue", self.chasqui_conn_id, self.queue_name)
        return ("chasqui", "completion", self.chasqui_conn_id, self.queue_name, self.cursor_name)

    @classmethod
    def create_shared_stream_producer(cls, kwargs: dict[str, Any]) -> QueueModeProducer | CompletionModeProducer:
        trigger = cls(**kwargs)
        if trigger.mode == "queue":
            return QueueModeProducer(queue_name=trigger.queue_name, chasqui_conn_id=trigger.chasqui_conn_id)
        return CompletionModeProducer(queue_name=trigger.queue_name, chasqui_conn_id=trigger.chasqui_conn_id,
                                      cursor=trigger.cursor_name or "")

    def decide(self, raw: QueueJob | CompletedJob) -> TriggerEvent | str | None:
        """This watcher's verdict on one raw event: an event to fire, a reason to refuse it
        (queue mode: dead-letter), or None to let it pass (completion mode: not ours)."""
        if isinstance(raw, CompletedJob):
            if raw.event != "completed" or (self.job_names is not None and raw.name not in self.job_names):
                return None
            return TriggerEvent(raw.payload())
        if self.job_names is not None and raw.name not in self.job_names:
            return f"job name {raw.name!r} is not watched (watching {', '.join(self.job_names)})"
        problem = json_safe_problem(raw.data, "data")
        if problem:
            return f"{problem}: an asset event carries JSON-compatible data only"
        return TriggerEvent(raw.payload())

    async def filter_shared_stream(self, shared_stream: AsyncIterator[Any]) -> AsyncIterator[TriggerEvent]:
        async for raw in shared_stream:
            verdict = self.decide(raw)
            if isinstance(verdict, TriggerEvent):
                yield verdict
            elif verdict is not None:
                raw.reject_reasons.append(verdict)
                self.log.warning("queue %s: refusing job %s: %s", self.queue_name, raw.job_id, verdict)
                reject_shared_stream_event()

    # -- standalone ----------------------------------------------------------------------------------
    async def run(self) -> AsyncIterator[TriggerEvent]:
        """The producer and this filter in one loop, for use outside the triggerer's shared-stream
        manager: an entry is advanced once the caller asks for the next event."""
        producer = self.create_shared_stream_producer(self.serialize()[1])
        try:
            async with contextlib.aclosing(producer.open_stream()) as stream:
                async for raw, broker_payload in stream:
                    verdict = self.decide(raw)
                    if isinstance(verdict, TriggerEvent):
                        yield verdict
                        outcome = AdvanceOutcome(acked=1, failed=0)
                    elif verdict is not None:
                        raw.reject_reasons.append(verdict)
                        outcome = AdvanceOutcome(acked=0, failed=0, rejected=1)
                    else:
                        outcome = AdvanceOutcome(acked=1, failed=0)
                    await producer.advance([AdvanceItem(broker_payload, outcome)])
        finally:
            await producer.aclose()
