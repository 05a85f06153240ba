"""A ``Worker``'s outcomes (``engine/worker.py``): buffered as the slots end jobs, written by
one flusher task in batches (``complete_batch`` and ``fail_batch`` calls), failures logged
within a budget.  Nothing is acknowledged before its handler finished, and a job is never
acked without its retry or dead-letter entry (both in one script call)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from ..core.codec import now_ms
from ..core.consumer import DECODE_FAILED, ROUTING_FAILED, Delivery
from ..core.failure import handler_traceback
from ..core.rows import COMPLETE_ENTRY_ID, FAIL_ENTRY_ID, FAIL_KIND, FAIL_REASON, FAIL_TRACEBACK
from ..core.running import result_too_large
from ..errors import CodecError, UnrecoverableError
from .metrics import NO_METRICS
from .worker_base import _packb, log
from .worker_events import WorkerEvents

__all__ = ["OutcomeWriter"]


class OutcomeWriter(WorkerEvents):
    """Buffers each job's outcome and writes them (see the module docstring)."""

    def _completed(self, done: list[tuple[Delivery, Any, int]]) -> None:
        """Buffer the successes ``(job, result, duration us)`` of a batch call or of a slot's
        ended pool calls (single in-process jobs do this inline in ``_slot``): one pass for all."""
        s, rows, sink = self.settings, self._done_rows, self._sink
        metrics = None if sink is NO_METRICS else sink  # once per pooled job: the null sink is skipped
        was_empty = not rows
        for dl, result, duration_us in done:
            if s.store_results:
                try:
                    encoded = _packb(result)
                except Exception as exc:  # noqa: BLE001 - the handler ran: never run it again for this
                    self._failed(dl, UnrecoverableError(f"handler result cannot be stored: {exc!r}"), duration_us)
                    continue
                if len(encoded) > s.max_result_bytes:
                    self._failed(dl, result_too_large(len(encoded), s.max_result_bytes), duration_us)
                    continue
            else:
                encoded = b""
            env = dl.envelope
            rows.append((dl.entry_id, env.id, dl.name, env.attempt + 1, duration_us, encoded))
            self._acking += 1
            if self._listening:
                self._listeners.emit("completed", self._job_view(dl), result)
            if metrics is not None:
                metrics.job_completed(self.name, dl.name, duration_us / 1e6)
            if s.max_jobs is None:
                self.processed += 1
            else:
                self._count_processed()
        if rows and (was_empty or len(rows) >= s.ack_batch):
            self._flush_wanted.set()
        self._room()

    def _failed(self, dl: Delivery, exc: BaseException, duration_us: int) -> str:
        """Buffer a failure for the flusher (like a success row); the entry stays in flight,
        pending in Redis, until the batch that retries or dead-letters it is written.

        Total: if deciding the route raises (a hostile retry override, an exception whose
        ``repr`` raises...), the entry is dead-lettered with reason ``routing_failed`` and the
        error as detail; nothing raised here can end a slot."""
        if self._listening:
            self._listeners.emit("failed", self._job_view(dl), exc)
        env = dl.envelope
        try:
            unrecoverable = isinstance(exc, UnrecoverableError)
            row, outcome, delay = self.core.failure_row(dl, exc, unrecoverable, duration_us, now_ms())
        except Exception as err:  # noqa: BLE001 - see the docstring
            log.error(
                "worker %s: routing the failure of entry %s raised %r; dead-lettered as %s",
                self.consumer_id,
                dl.entry_id,
                err,
                ROUTING_FAILED,
            )
            row, outcome, delay = self.core.routing_failed_row(dl, exc, err, duration_us), ROUTING_FAILED, 0
        # a dead-lettered row carries its formatted traceback; a retried one is formatted (~0.1-1 ms)
        # only if the log budget lets it be logged, so a retry storm costs no formatting
        self._buffer_failure(
            row,
            (env.id, dl.name, env.attempt + 1, outcome, delay, row[FAIL_TRACEBACK] if row[FAIL_KIND] == "d" else exc),
        )
        self._sink.job_failed(self.name, dl.name)
        if outcome == "retry":
            self._sink.job_retried(self.name, dl.name)
        else:
            self._sink.job_dead(self.name, dl.name, outcome)
        return outcome

    def _undecodable(self, dl: Delivery, exc: CodecError) -> None:
        """Dead-letter ``dl`` as ``decode_failed`` (its data is not msgpack, or would expand far
        past its size): buffered for the flusher like a failure; no handler ran."""
        row = self.core.reject_row(self.core.undecodable(dl, exc))
        self._buffer_failure(row, (dl.envelope.id, dl.name, dl.envelope.attempt + 1, DECODE_FAILED, 0, str(exc)))
        self._sink.job_dead(self.name, dl.name, DECODE_FAILED)

    def _buffer_failure(self, row: tuple[Any, ...], info: tuple[Any, ...]) -> None:
        """A ``fail_batch`` row for the flusher, and what its log line needs; the entry stays
        in flight, pending in Redis, until the batch is written."""
        self._fail_rows.append(row)
        self._fail_info.append(info)
        self._acking += 1
        if len(self._fail_rows) == 1 or len(self._fail_rows) >= self.settings.ack_batch:
            self._flush_wanted.set()
        self._count_processed()

    async def _requeue_grouped(self, dl: Delivery, ms: int) -> None:
        try:
            await self._emitted()  # its `active` event first
            await self._intake.requeue_grouped(dl, ms)
        except Exception as exc:  # noqa: BLE001 - the entry stays pending: reclaimed after the lease
            log.warning("worker %s: job %s could not go back to its group: %s", self.consumer_id, dl.envelope.id, exc)
            self._intake.release(dl.entry_id)
        self._room()

    async def _flusher(self) -> None:
        """Batch acks: up to ``ack_batch`` rows or ``ack_idle_ms`` after the first one."""
        assert self._stopping is not None
        s, intake = self.settings, self._intake
        lease_check = s.claim_min_idle_ms / 2000  # see Intake.check_lease
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            # Wait up to ack_idle_ms for more rows only while handlers are queued or running;
            # with none left, waiting would only delay the acks.  The wait ends early when a
            # batch fills (or the final flush): sleeping it out held the finished entries, the
            # reading window filled, and the reader stood idle (a third of a no-op worker's rate).
            if (
                len(self._done_rows) < s.ack_batch
                and len(self._fail_rows) < s.ack_batch
                and not self._final_flush
                and (self._deque or len(intake.in_flight) > self._acking)
            ):
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(s.ack_idle_ms / 1000):
                        await self._flush_wanted.wait()
                self._flush_wanted.clear()
            if intake.in_flight and time.monotonic() - intake.renewed_at > lease_check:  # inline: once per flush
                await intake.check_lease()
            while self._fail_rows:
                await self._flush_failures()
            while self._done_rows:
                batch = self._done_rows[: s.ack_batch]
                del self._done_rows[: s.ack_batch]  # in place: the slots append to this list
                rows: list[Any] = []
                try:
                    await self._ahead_of_outcomes()
                    rows = intake.owned(batch, COMPLETE_ENTRY_ID)  # just before: a lease may lapse meanwhile
                    await intake.settle(done=rows)
                except Exception as exc:  # noqa: BLE001 - see _unacked
                    self._unacked(len(rows), exc)
                finally:
                    self._acking -= len(batch)
                self._room()
            if self._final_flush:
                if self._fail_rows or self._done_rows:  # written while the others were
                    self._flush_wanted.set()
                    continue
                return

    async def _ahead_of_outcomes(self) -> None:
        """Write what must land before a batch of outcomes just taken from the buffer: its
        jobs' ``active`` events (in flight since they started) and last progress reports
        (recorded before they ended: engine/progress.py).  Called per batch, after taking it:
        once per pass, before the batches, a job that started, reported and ended while an
        earlier batch was written had its outcome written before its report (a third of 600
        jobs ending together: ``test_the_last_reports_of_jobs_ending_together_are_written_before_their_outcomes``)."""
        await self._emitted()
        if self._progress.pending:
            await self._progress.flush()

    def _unacked(self, n: int, exc: BaseException) -> None:
        """A batch that could not be written stays pending in Redis; the intake released its
        entries, so recovery reclaims them after ``claim_min_idle_ms`` and re-runs them
        (at-least-once), and the flusher lives on for the next batches."""
        log.error(
            "worker %s: %d acks not written (%s); the entries stay pending and will be reclaimed",
            self.consumer_id,
            n,
            exc,
        )

    async def _flush_failures(self) -> None:
        """Write up to ``ack_batch`` buffered failures in one ``fail_batch`` call."""
        n, intake = self.settings.ack_batch, self._intake
        batch, info = self._fail_rows[:n], self._fail_info[:n]
        del self._fail_rows[:n], self._fail_info[:n]
        rows: list[Any] = []
        try:
            await self._ahead_of_outcomes()
            rows = intake.owned(batch, FAIL_ENTRY_ID)
            if len(rows) < len(batch):
                kept = set(map(id, rows))
                info = [i for row, i in zip(batch, info) if id(row) in kept]
            await intake.settle(failed=rows)
        except Exception as exc:  # noqa: BLE001 - see _unacked
            self._unacked(len(rows), exc)
        finally:
            self._acking -= len(batch)
        self._room()
        self._log_failures(rows, info)

    def _log_failures(self, rows: list[tuple[Any, ...]], info: list[tuple[Any, ...]]) -> None:
        """One WARNING per failed job, with its traceback, within the log budget (see the
        module docstring); the records carry ``queue``, ``job_id``, ``job_name`` and
        ``attempt`` for structured log formats."""
        for row, (job_id, name, attempt, outcome, delay, tb) in zip(rows, info):
            if not self._intake.take_log():
                continue
            if not isinstance(tb, str):  # a retried attempt's exception, formatted now that it is logged
                tb = handler_traceback(tb)
            then = f"retry in {delay} ms" if outcome == "retry" else f"dead-lettered ({outcome})"
            log.warning(
                "worker %s: job %s %s attempt %d failed: %s; %s%s",
                self.consumer_id,
                job_id,
                name,
                attempt,
                row[FAIL_REASON],
                then,
                "\n" + tb.rstrip("\n") if tb else "",
                extra={"queue": self.name, "job_id": job_id, "job_name": name, "attempt": attempt},
            )
