"""The queue-mode watcher: the jobs of a queue as Airflow asset events.

It is a consumer of the queue's group like a worker, through the same
:class:`~airflow_provider_chasqui.engine.intake.Intake` (reading, reclaiming, the arrival gate,
dead-lettering, leases), and differs in what it does with a job: instead of running a handler it
collects a batch (lingering while more arrive), hands it to Airflow as one raw event and, in
:meth:`QueueModeProducer.advance`, once Airflow saved the asset events, acknowledges what was
taken, dead-letters what every watcher refused and holds the rest for redelivery.  The intake
renews the batch's leases meanwhile, however slowly Airflow saves it.  What users are promised:
``queue_events.py``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.calls import str_reply
from ..core.codec import now_ms
from ..core.consumer import ConsumerCore, Delivery
from ..core.event_follow import stream_id
from ..core.keys import DEFAULT_GROUP, validate_queue_name
from ..core.retry import RetryPolicy
from ..core.rows import COMPLETE_ENTRY_ID, FAIL_ENTRY_ID, CompleteRow, FailRow
from ..core.settings import QueueSettings
from ..core.urls import WAIT_BLOCK_MS
from ..engine.cancellation import raise_if_cancelling
from ..engine.identity import identity, package_version
from ..engine.intake import Intake
from ..engine.promoter import Promoter
from ..engine.queue import Queue
from ._batching import (
    ADVANCE_TRIES,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_BATCH,
    TRANSIENT,
    AdvanceItem,
    AdvanceOutcome,
    Flow,
    SharedStreamProducer,
    batch_payload,
    check_batching,
    open_queue,
    watcher_backoff,
)

__all__ = ["QueueJob", "QueueBatch", "QueueModeProducer", "WATCHER_CONSUMER", "MAX_ATTEMPTS"]

log = logging.getLogger(__name__)

WATCHER_CONSUMER = "airflow-asset-watcher"
MAX_ATTEMPTS = 25  # as a worker's default: a job's own ``attempts`` override wins


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

    @classmethod
    def of(cls, queue: str, dl: Delivery) -> QueueJob:
        """A job the intake admitted (its data already decoded: ``Intake(decode=True)``)."""
        env = dl.envelope
        return cls(
            queue,
            dl.entry_id,
            env.id,
            dl.name,
            dl.data,
            dl.delivery_count,
            env.created_at_ms,
            dl.raw,
            time.monotonic_ns(),
            raw_name=dl.raw_name,
        )

    def payload(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "data": self.data,
            "attempt": self.attempt,
            "created_at_ms": self.created_at_ms,
            "entry_id": str_reply(self.entry_id),
        }


@dataclass(eq=False)
class QueueBatch:
    """The jobs of one read, oldest first: one raw event, its own ``broker_payload``, and at most
    one ``TriggerEvent`` per watcher."""

    queue: str
    jobs: list[QueueJob]

    def payload(self, jobs: Sequence[QueueJob] | None = None) -> dict[str, Any]:
        return batch_payload("queue", self.queue, [job.payload() for job in (self.jobs if jobs is None else jobs)])


class QueueModeProducer(SharedStreamProducer):
    """Reads a queue as its consumer (group ``default``, consumer ``airflow-asset-watcher``) in
    batches of at most ``max_batch`` jobs and acknowledges or dead-letters them in
    :meth:`advance` only.

    A batch is what one :meth:`Intake.next_batch` finds: the watcher's own entries left pending
    by an earlier run, entries due for redelivery, idle entries of dead consumers, then new
    entries, lingering ``linger_ms`` while more arrive (up to ``max_batch`` and about a second).
    The next batch is read only after this one was advanced (and ``event_gap_ms`` more).
    Entries resolved with a failure (ack timeout, subscriber overflow) or that no subscriber
    received stay pending and are re-read after ``redeliver_after_ms``.  The leases of a batch
    are renewed until it is advanced, ten times per ``claim_min_idle_ms``.
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
        check_batching(max_batch, linger_ms, event_gap_ms)
        self.queue_name = validate_queue_name(queue_name)
        self.chasqui_conn_id = chasqui_conn_id
        self.max_batch = max_batch
        self.linger_ms = linger_ms
        self.block_ms = min(block_ms, WAIT_BLOCK_MS)  # a read must end within the Queue's socket timeout
        self.claim_min_idle_ms = claim_min_idle_ms
        self.redeliver_after_ms = redeliver_after_ms
        self.promote = promote
        self.core = ConsumerCore(
            queue_name,
            group=DEFAULT_GROUP,
            consumer_id=WATCHER_CONSUMER,
            max_attempts=MAX_ATTEMPTS,
            settings=QueueSettings(),
            retry=RetryPolicy(),
            events=True,
            result_ttl_ms=0,
            failure_ttl_ms=24 * 3600 * 1000,
        )
        self.keys = self.core.keys
        self.flow = Flow(gap_ms=event_gap_ms)
        self.intake: Intake | None = None  # built once the connection is (open_stream)
        self._queue: Queue | None = None
        self._tasks: list[tuple[Promoter | None, asyncio.Task[None]]] = []  # the promoter, the lease renewal
        self.acked_total = 0
        self.refused_total = 0
        self.batches_total = 0

    @property
    def dead_lettered_total(self) -> int:
        """Entries sent to the DLQ: by the arrival gate, and refused by every watcher."""
        return self.refused_total + (self.intake.dead_lettered if self.intake is not None else 0)

    async def open_stream(self) -> AsyncGenerator[tuple[QueueBatch, QueueBatch], None]:
        self._queue = await open_queue(self.chasqui_conn_id, self.queue_name)
        label = f"chasqui watcher of queue {self.queue_name}"
        intake = self.intake = Intake(
            self._queue.driver,
            self.core,
            lease_ms=self.claim_min_idle_ms,
            decode=True,
            write_tries=ADVANCE_TRIES,
            label=label,
        )
        intake.identity = identity(  # listed live beside the workers (core/liveness.py)
            handlers=["asset events"],
            concurrency=self.max_batch,
            started_ms=now_ms(),
            lease_ms=self.claim_min_idle_ms,
            version=package_version(),
            kind="airflow watcher",
        )
        backoff = watcher_backoff()
        while not self._tasks:
            try:
                await self._prepare(intake)
            except TRANSIENT as exc:
                raise_if_cancelling()
                delay = backoff.next()
                log.warning("%s: Redis unavailable (%s); retrying in %.1f s", label, exc, delay)
                await asyncio.sleep(delay)
        while True:
            if not await self.flow.wait_for_room(self.block_ms / 1000):
                continue
            ready = await intake.next_batch(self.max_batch, self.block_ms, self.linger_ms)
            if not ready:
                continue
            jobs = sorted(
                (QueueJob.of(self.queue_name, dl) for dl in ready), key=lambda j: stream_id(str_reply(j.entry_id))
            )
            self.flow.outstanding += 1
            self.batches_total += 1
            batch = QueueBatch(self.queue_name, jobs)
            log.debug("%s: batch of %d job(s)", label, len(jobs))
            yield batch, batch

    async def _prepare(self, intake: Intake) -> None:
        """The group, the lease renewal and (``promote``) the queue's delayed-job promoter."""
        assert self._queue is not None
        await intake.open()
        tasks: list[tuple[Promoter | None, asyncio.Task[None]]] = []
        if self.promote:
            promoter = Promoter(self._queue.driver, self.queue_name, poll_interval_ms=250)
            tasks.append((promoter, asyncio.create_task(promoter.run(), name=f"chasqui-promoter[{self.queue_name}]")))
        tasks.append((None, asyncio.create_task(intake.run_leases(), name=f"chasqui-lease[{self.queue_name}]")))
        self._tasks = tasks
        log.info("chasqui watcher reading queue %s as %s/%s", self.queue_name, DEFAULT_GROUP, WATCHER_CONSUMER)

    def get_advance_lane(self, broker_payload: QueueBatch) -> str:
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
          ``detail`` = the watchers' reasons (the same ``fail_batch`` call); looked at by none
          (a watcher left before reading it): held for redelivery.

        An entry whose lease was lost meanwhile (another consumer reclaimed it) is left alone.
        """
        intake = self.intake
        if intake is None or self._queue is None:
            raise RuntimeError(f"queue {self.queue_name}: advance() before open_stream() opened Redis")
        now_ns = time.monotonic_ns()
        done: list[CompleteRow] = []
        dead: list[FailRow] = []
        held: dict[bytes, int] = {}
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
                    held[job.entry_id] = job.attempt
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
                        self.core.refusal_row(
                            job.entry_id, job.job_id, job.name, job.attempt, job.raw, detail, job.raw_name
                        )
                    )
        intake.hold(held, time.monotonic() + self.redeliver_after_ms / 1000)
        await intake.settle(intake.owned(done, COMPLETE_ENTRY_ID), intake.owned(dead, FAIL_ENTRY_ID))
        self.acked_total += len(done)
        self.refused_total += len(dead)
        self.flow.release(len(batch))

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, []
        for promoter, task in tasks:
            if promoter is not None:
                promoter.stop()
                try:
                    await asyncio.wait_for(task, 5)
                except (TimeoutError, asyncio.CancelledError, Exception):  # noqa: BLE001 - best effort
                    task.cancel()
            else:
                task.cancel()
        await asyncio.gather(*(task for _p, task in tasks), return_exceptions=True)
        if self.intake is not None:
            await self.intake.close()
        queue, self._queue = self._queue, None
        if queue is not None:
            await queue.close()
