"""The completion-mode watcher: the ``completed`` events of a queue as Airflow asset events.

It follows ``{chasqui:<q>}:events`` (XREAD, no group) from a cursor kept in Redis; see
``queue_events.py`` for what users are promised.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.calls import command, str_reply
from ..core.event_follow import LAST_STREAM_ID, EventCursor, is_stream_id, stream_id
from ..core.keys import QueueKeys, validate_queue_name
from ..core.urls import WAIT_BLOCK_MS
from ..engine.cancellation import raise_if_cancelling
from ..engine.events import parse_event
from ..engine.queue import Queue
from ..errors import ConfigError, ScriptError
from ._batching import (
    ADVANCE_TRIES,
    DEFAULT_LINGER_MS,
    DEFAULT_MAX_BATCH,
    MAX_COLLECT_SECS,
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

__all__ = ["CompletedJob", "CompletionBatch", "CompletionModeProducer"]

log = logging.getLogger(__name__)


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
        return batch_payload("completion", self.queue, [c.payload() for c in chosen])


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
        check_batching(max_batch, linger_ms, event_gap_ms)
        self.queue_name = validate_queue_name(queue_name)
        self.chasqui_conn_id = chasqui_conn_id
        self.cursor = cursor
        self.keys = QueueKeys.for_queue(queue_name)
        self.cursor_key = self.keys.cursor(cursor)
        self.max_batch = max_batch
        self.linger_ms = linger_ms
        self.block_ms = min(block_ms, WAIT_BLOCK_MS)  # a read must end within the Queue's socket timeout
        self.reread_after_ms = reread_after_ms
        self.flow = Flow(gap_ms=event_gap_ms)
        self._queue: Queue | None = None
        self.committed = ""  # the cursor's value: every event up to it was saved by Airflow
        self.events = EventCursor(self.keys, count=max_batch, block_ms=self.block_ms)  # what was read
        self._seek_at: float | None = None
        self.batches_total = 0

    async def open_stream(self) -> AsyncGenerator[tuple[CompletionBatch, str], None]:
        self._queue = await open_queue(self.chasqui_conn_id, self.queue_name)
        backoff = watcher_backoff()
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
                backoff.reset()
            except TRANSIENT as exc:
                raise_if_cancelling()
                delay = backoff.next()
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
            raise_if_cancelling()  # redis-py can swallow a cancel that lands in a blocking read (redis-py#2028)
            if not rows and self.events.stuck:  # at the largest id: read on once the stream moved on
                self.events.unstick(await self._queue.driver.call(self.events.end_call()))
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
            stop = stop or time.monotonic() + MAX_COLLECT_SECS
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
        if through is not None and (
            stream_id(through) > stream_id(self.committed)
            or self.committed == LAST_STREAM_ID  # nothing follows it: what came next was read after a new stream began
        ):
            await self._commit(through)
        self.flow.release(len(batch))

    async def _commit(self, event_id: str) -> None:
        assert self._queue is not None
        backoff = watcher_backoff()
        while True:
            try:
                await self._queue.driver.call(command("SET", self.cursor_key, event_id))
                break
            except TRANSIENT as exc:
                raise_if_cancelling()
                if backoff.failures + 1 >= ADVANCE_TRIES:
                    raise
                log.warning("cursor %s: write failed (%s); retrying", self.cursor_key, exc)
                await asyncio.sleep(backoff.next())
        self.committed = event_id

    async def aclose(self) -> None:
        queue, self._queue = self._queue, None
        if queue is not None:
            await queue.close()
