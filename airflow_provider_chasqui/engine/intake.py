"""``Intake``: one consumer of a queue's group, everything between Redis and whoever runs a job.

The :class:`~airflow_provider_chasqui.engine.worker.Worker` (a handler per job) and the Airflow
queue-events watcher (``triggers/queue_watcher.py``: an asset event per batch) are both
consumers of a queue's group.  What they do with a job differs; how entries reach them and
leave them does not, and lives here once:

* **reading** (:meth:`Intake.next_batch`): what is owed first (``intake_recovery.py``) -- this consumer's own pending
  entries left by an earlier run, entries :meth:`hold`-ed for redelivery that are due, idle
  entries of dead consumers (a pass every half lease, and again as the entries it saw lapse:
  each a ``stalled`` event, and ``on_stalled`` hears it) -- then new entries, optionally
  lingering while more arrive; on a queue that uses priorities, the most urgent prioritized
  jobs are moved to the stream when it runs dry
  (``core/priorities.py``).  The blocking read runs on ``reader`` (a single-connection client
  that :meth:`unblock` can interrupt) or on the driver.  A NOGROUP (the stream was deleted)
  recreates the group; a transient error is logged and waited out with one :class:`Backoff`.
* **the arrival gate** (``core.consumer``) and **one dead-letter path**: refused entries go to
  ``fail_batch`` (``reject_row``), within a failure-log budget.  With ``decode=True`` the data
  of every admitted job is decoded here (bounded; undecodable: ``decode_failed``).
* **flow controls** (:attr:`flow`, ``flow_gate.py``): a batch about to be handed out obeys
  the queue's pause, concurrency and rate limits and ``RateLimited`` block; what may not start
  yet is held (in flight, leases renewed, no attempt counted) and handed out first once it
  may; nothing new is read meanwhile, but the recovery pass goes on, and what it reclaims is
  held ahead.  Concurrency slots are renewed with the leases and freed with the settling writes.
* **leases** (``intake_leases.py``): every entry handed out is in :attr:`in_flight` until settled or released, and
  :meth:`run_leases` renews them ``RENEWALS_PER_LEASE`` times per lease (``renew_lease``).  An
  entry another consumer took over meanwhile is *lost*: ``on_lost`` hears of it, and its
  outcome is never written (XACK does not check ownership).  :meth:`lease_held` renews first
  when the last renewal is late (a paused process must not start a job someone else runs).
* **settling** (:meth:`settle`, ``intake_settling.py``): finished entries (``complete_batch``) and failed or refused
  ones (``fail_batch``) in one round trip, retried through outages, the lost ones dropped.
* **housekeeping**: removing consumers idle for 10 leases, every 5 (:meth:`next_batch`), and
  this consumer at a clean stop (:meth:`leave`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..core.calls import int_reply, str_reply
from ..core.codec import now_ms
from ..core.consumer import ConsumerCore, Delivery, Rejected
from ..core.controls import RateLimit, set_rate_limit
from ..core.features import Features
from ..core.groups import take_grouped_call
from ..core.history import MinuteCounts
from ..core.liveness import REAP_IDLE_LEASES, leave_calls
from ..core.pacing import Backoff, LogBudget
from ..core.priorities import take_prioritized_call
from ..drivers_common import translate_error
from ..errors import TRANSIENT_ERRORS, BusyGroupError, ChasquiError, CodecError, NoGroupError
from ._driver import AsyncDriver
from .cancellation import raise_if_cancelling
from .flow_gate import FlowGate
from .intake_leases import RENEWALS_PER_LEASE, IntakeLeases
from .intake_recovery import IntakeRecovery, Row
from .intake_settling import IntakeSettling
from .metrics import NO_METRICS, WorkerMetrics

__all__ = ["Intake", "Row"]

log = logging.getLogger(__name__)
# what a read survives (Intake._weather): a deleted stream's NOGROUP, and the transient errors
READ_ERRORS: tuple[type[BaseException], ...] = (NoGroupError, *TRANSIENT_ERRORS)
REAP_EVERY_LEASES = 5  # how often idle consumers are removed (REAP_IDLE_LEASES: core/liveness.py)
PRIORITY_POLL_MS = 100  # the longest blocking read on a queue that uses priorities
MAX_LINGER_SECS = 1.0  # a lingering batch stops growing after this long, even if jobs keep arriving


class Intake(IntakeRecovery, IntakeLeases, IntakeSettling):
    """The consumer ``core.consumer_id`` of group ``core.group``.  Build it anywhere; every
    method but the constructor runs on the event loop.  Not thread-safe."""

    def __init__(
        self,
        driver: AsyncDriver,
        core: ConsumerCore,
        *,
        lease_ms: int,
        reader: Any = None,
        stopping: asyncio.Event | None = None,
        decode: bool = False,
        write_tries: int | None = None,
        log_budget: LogBudget | None = None,
        metrics: WorkerMetrics = NO_METRICS,
        on_lost: Callable[[dict[bytes, bytes]], None] | None = None,
        label: str = "",
        priority_batch: int | None = None,
        rate_limit: RateLimit | None = None,
        detect_stalls: bool = True,
        on_stalled: Callable[[list[str]], None] | None = None,
        reconnect_max_attempts: int | None = None,
    ) -> None:
        self.driver, self.core = driver, core
        self.rate_limit = rate_limit  # set as the queue's when the intake opens (None: left as it is)
        self.lease_ms = lease_ms
        # how long an entry (or its slot) stays held after the last renewal began: see RENEWALS_PER_LEASE
        self.hold_ms = lease_ms + -(-lease_ms // RENEWALS_PER_LEASE)
        self.reader = reader  # a raw single-connection client for blocking reads, or None: the driver
        self.stopping = stopping or asyncio.Event()
        self.decode = decode
        self.write_tries = write_tries  # None: writes retry through outages until stopping
        self.log_budget = log_budget or LogBudget(10, 60.0)
        self.metrics = metrics
        self.on_lost = on_lost
        # entries reclaimed from a consumer that stopped renewing them: a ``stalled`` event each,
        # and ``on_stalled`` hears their job ids (chasquimq's stalled-job detector)
        self.detect_stalls = detect_stalls
        self.on_stalled = on_stalled
        self.reconnect_max_attempts = reconnect_max_attempts  # failed reads in a row before giving up
        self._stalls: set[bytes] = set()  # reclaimed, not gated yet
        self.label = label or f"consumer {core.consumer_id} of {core.keys.queue}"
        self.priority_batch = priority_batch  # the most one read takes on a queue that uses priorities
        # who this consumer is, beaten with the leases (core/liveness.py); None: no heartbeat
        self.identity: dict[str, Any] | None = None
        self.healthy: Callable[[], bool] = lambda: True
        self.left_running: Callable[[], int] = lambda: 0  # beaten too: Worker.left_running
        self.beat_log = LogBudget(1, 60.0)
        self.history = MinuteCounts()  # settled jobs per minute, written with the beat (core/history.py)
        self.features = Features()  # replaced by open()
        self.in_flight: set[bytes] = set()  # handed out, neither settled nor released
        self.settling: set[bytes] = set()  # in flight, their settling write under way
        self.lost: dict[bytes, bytes] = {}  # in-flight entries another consumer took over -> its name
        self.redeliver: dict[bytes, tuple[float, int]] = {}  # held: entry id -> (due at, deliveries so far)
        self.renewed_at = time.monotonic()  # when the last renewal that covered every in-flight entry began
        self.dead_lettered = 0
        self._own_after: str | None = "-"  # cursor in our own pending list; None once it was re-read
        self._next_recovery = 0.0
        self._next_reap = time.monotonic() + REAP_EVERY_LEASES * lease_ms / 1000
        self._next_cursor_check = time.monotonic() + lease_ms / 1000
        self._reader_id: int | None = None
        self._longest_block_ms = 0  # a consumer blocked in a read looks idle that long: never reaped for it
        self._renewal: asyncio.Future[None] | None = None  # one renewal shared by every lease_held()
        self._backoff = Backoff()
        self._deferred: BaseException | None = None  # a dead-lettering failure, raised on the next read
        self.flow = FlowGate(
            driver,
            core.keys,
            lease_ms=self.hold_ms,
            label=self.label,
            take_log=self.take_log,
            sleep=self.pause,
            metrics=metrics,
        )

    # ---- the group ----------------------------------------------------------------------
    async def open(self) -> None:
        """Learn the server's features, create the group (and the stream) unless it exists, and
        set the queue's rate limit this consumer was given (chasquimq's ``rate_limit_max``)."""
        self.features = await self.driver.features()
        await self.ensure_group()
        if self.rate_limit is not None:
            await self.driver.run(set_rate_limit(self.core.keys, self.rate_limit.max_jobs, self.rate_limit.per_ms))

    async def ensure_group(self) -> None:
        try:
            await self.driver.call(self.core.create_group())
        except BusyGroupError:  # it exists
            pass

    # ---- reading ------------------------------------------------------------------------
    async def next_batch(self, room: int, block_ms: int, linger_ms: int | None = None) -> list[Delivery]:
        """Up to ``room`` jobs: what is owed first, then new entries (waiting up to ``block_ms``
        when nothing is owed; ``linger_ms``: once one arrived, read on while more arrive within
        that, up to ``MAX_LINGER_SECS``).  Refused entries are dead-lettered here.  Returns []
        when nothing came, after a transient error (logged, backed off) or a NOGROUP (the group
        is recreated); a failure to dead-letter is raised by the next call, after the jobs of
        this one were handed over (they never wait on the DLQ)."""
        if self._deferred is not None:
            exc, self._deferred = self._deferred, None
            raise exc
        if await self.flow.wait_if_blocked():  # a handler raised RateLimited: read nothing, start nothing
            return []
        if self.flow.held:
            return await self._release_held(room)
        ready: list[Delivery] = []
        self._longest_block_ms = max(self._longest_block_ms, block_ms)
        try:
            owed = await self._owed(room)
            if owed:
                ready += await self._gate(*self.core.gate_rows(owed))
            if len(owed) < room and not self.stopping.is_set():
                # the wait ends in time for the next recovery pass, even on an idle queue
                block = max(1, min(block_ms, int((self._next_recovery - time.monotonic()) * 1000)))
                entries = await self._read_new(room - len(owed), None if owed else block)
                stop = time.monotonic() + MAX_LINGER_SECS
                while linger_ms is not None and entries and len(owed) + len(entries) < room:
                    more = await self._read(room - len(owed) - len(entries), linger_ms or None)
                    entries += more
                    if not more or time.monotonic() >= stop:
                        break
                if entries:
                    ready += await self._gate(*self.core.gate_fresh(entries))
            if ready:
                # The gate holds the batch before it reads the controls: if that read fails (Redis
                # went away just now), the gate hands it out later, so none of it goes out now too.
                batch, ready = ready, []
                ready = await self.flow.admit(batch)
                await self._settle_to_cancel()
            else:
                await self._check_cursor()
            self._backoff.reset()
            await self._housekeeping()
        except READ_ERRORS as exc:
            await self._weather(exc)
        return ready

    async def _release_held(self, room: int) -> list[Delivery]:
        """What the gate lets go of the jobs it holds.  The recovery pass goes on meanwhile:
        a dead consumer's entries join the held jobs, ahead of them (they are older), rather
        than wait until this consumer holds nothing (under a concurrency limit, its whole
        read-ahead run a slot at a time)."""
        try:
            if time.monotonic() >= self._next_recovery:
                reclaimed = await self._recover(room)
                if reclaimed:
                    await self.flow.hold_first(await self._gate(*self.core.gate_rows(reclaimed)))
            ready = await self.flow.release_held(room)
            await self._settle_to_cancel()
            return ready
        except READ_ERRORS as exc:
            await self._weather(exc)
        return []

    async def _weather(self, exc: BaseException) -> None:
        """A read's failure: a NOGROUP (the stream and its group were deleted under us)
        recreates the group; a transient error is waited out."""
        if isinstance(exc, NoGroupError):
            try:
                await self.ensure_group()
                return
            except TRANSIENT_ERRORS as again:
                exc = again
        await self._wait_out(exc)

    async def _wait_out(self, exc: BaseException) -> None:
        self._reader_id = None  # a new connection has a new id
        raise_if_cancelling()  # a cancelled read can surface as a lost connection: never wait that out
        if not self.stopping.is_set():
            delay = self._backoff.next()
            self._backoff.check_limit(self.reconnect_max_attempts, exc)  # ReconnectLimitError: the caller stops
            log.warning("%s: Redis unavailable (%s); reading again in %.2fs", self.label, exc, delay)
            await self.pause(delay)

    async def _read(self, want: int, block_ms: int | None) -> list[Any]:
        """New entries (``block_ms`` None: without waiting), as ``(entry_id, fields)`` pairs."""
        call = self.core.read(want, block_ms)
        if self.reader is None:
            reply = await self.driver.call(call)
        else:
            try:
                if self._reader_id is None:
                    self._reader_id = int_reply(await self.reader.execute_command("CLIENT", "ID"))
                reply = await self.reader.execute_command(*call.args)
            except Exception as exc:  # the reader is a raw client: its errors cross the boundary here
                raise translate_error(exc) from exc
        raise_if_cancelling()  # redis-py can swallow a cancel that lands in a blocking read (redis-py#2028)
        return reply[0][1] if reply else []  # one stream read: its entries, as they came

    async def _read_new(self, want: int, block_ms: int | None) -> list[Any]:
        """:meth:`_read`; on a queue that uses priorities or job groups, when the stream has
        fewer than ``want`` for the group, the most urgent prioritized jobs and then the groups'
        next jobs in turn are moved to it first (``core/priorities.py``, ``core/groups.py``),
        and a wait is cut to ``PRIORITY_POLL_MS``, so jobs added meanwhile are seen."""
        controls = await self.flow.cached()
        if not (controls.prioritized or controls.grouped):
            return await self._read(want, block_ms)
        want = min(want, self.priority_batch or want)  # the first read, sized before the controls were known
        entries = await self._read(want, None)
        k, limit = self.core.keys, self.core.settings.max_stream_len
        for lane in ("prioritized", "grouped"):  # the most urgent first, then the groups' turns
            if not getattr(controls, lane) or len(entries) >= want:
                continue
            n = want - len(entries)
            call = (
                take_prioritized_call(k, n, limit)
                if lane == "prioritized"
                else take_grouped_call(k, n, limit, self.hold_ms)
            )
            if int_reply(await self.driver.call(call)):
                entries += await self._read(want - len(entries), None)
        if entries or block_ms is None:
            return entries
        return await self._read(want, min(block_ms, PRIORITY_POLL_MS))

    async def _gate(self, ready: list[Delivery], rejected: list[Rejected]) -> list[Delivery]:
        """Take ``ready`` in flight (decoding their data first with ``decode``) and dead-letter
        what the gate refused."""
        if self.decode:
            kept = []
            for dl in ready:
                try:
                    dl.payload()
                except CodecError as exc:
                    rejected.append(self.core.undecodable(dl, exc))
                else:
                    kept.append(dl)
            ready = kept
        if self._stalls:
            stalls, self._stalls = self._stalls, set()
            await self._report_stalls(stalls, ready, rejected)
        self.in_flight.update([dl.entry_id for dl in ready])
        if rejected:
            try:
                await self.dead_letter(rejected)
            except Exception as exc:  # noqa: BLE001 - raised by the next read, after these jobs were handed over
                self._deferred = exc
        return ready

    async def dead_letter(self, rejected: list[Rejected]) -> None:
        """Entries that will never run, to the DLQ in one ``fail_batch`` call (the only
        dead-letter path of a consumer), each logged within the failure-log budget."""
        for r in rejected:
            if self.take_log():
                log.error(
                    "%s: entry %s dead-lettered: %s %s",
                    self.label,
                    str_reply(r.entry_id),
                    r.reason,
                    r.detail,
                    extra={"queue": self.core.keys.queue, "job_id": r.job_id or None},
                )
        await self._write([self.core.fail([self.core.reject_row(r) for r in rejected], self.features, now_ms())])
        self.dead_lettered += len(rejected)
        for r in rejected:
            self.metrics.job_dead(self.core.keys.queue, r.name, r.reason)

    def take_log(self) -> bool:
        """Whether one more failure record fits the log budget (reporting what did not)."""
        ok, suppressed = self.log_budget.take()
        if suppressed:
            self.log_suppressed(suppressed)
        return ok

    def log_suppressed(self, count: int) -> None:
        b = self.log_budget
        log.warning(
            "%s: %d more failed jobs or refused entries not logged (at most %d per %gs)",
            self.label,
            count,
            b.burst,
            b.window,
            extra={"queue": self.core.keys.queue},
        )

    async def _housekeeping(self) -> None:
        """Every ``REAP_EVERY_LEASES`` leases: remove consumers with nothing pending that were
        idle for ``REAP_IDLE_LEASES`` leases (or read blocks): consumers that died or left
        without cleaning up."""
        if time.monotonic() < self._next_reap:
            return
        self._next_reap = time.monotonic() + REAP_EVERY_LEASES * self.lease_ms / 1000
        try:
            gone = await self.reap(REAP_IDLE_LEASES * max(self.lease_ms, self._longest_block_ms))
        except ChasquiError as exc:  # tried again next time
            log.warning("%s: removing idle consumers failed: %s", self.label, exc)
            return
        if gone:
            log.info("%s removed %d idle consumers: %s", self.label, len(gone), gone)

    async def _check_cursor(self) -> None:
        """Once a lease while reads bring nothing: a group cursor past the stream's last id
        reads nothing ever again (a full stream let out with ``XSETID``, a foreign ``SETID``);
        ``rewind_group.lua`` moves it back to where nothing delivered is read twice."""
        if time.monotonic() < self._next_cursor_check:
            return
        self._next_cursor_check = time.monotonic() + self.lease_ms / 1000
        try:
            to = str_reply(await self.driver.call(self.core.rewind_group()))
        except ChasquiError as exc:  # tried again next time
            log.warning("%s: checking the group's cursor failed: %s", self.label, exc)
            return
        if to:
            log.warning(
                "%s: the group's cursor was past the stream's last id, so no new job could be read;"
                " moved back to %s (the largest id it holds pending, or 0-0 with none)",
                self.label,
                to,
                extra={"queue": self.core.keys.queue},
            )

    async def reap(self, min_idle_ms: int, name: str = "") -> list[Any]:
        """Remove consumers (or only ``name``) with nothing pending, idle ``min_idle_ms``."""
        return list(await self.driver.call(self.core.reap_consumers(min_idle_ms, name)) or [])

    async def unblock(self) -> bool:
        """End a blocking read now (CLIENT UNBLOCK); best effort, it ends at its BLOCK anyway.
        False if the call failed (see ``cancellation.unblock_until_done``)."""
        if self._reader_id is None:  # not connected yet (or reconnecting): nothing blocks yet
            return True
        try:
            await self.driver.client.execute_command("CLIENT", "UNBLOCK", self._reader_id)
        except Exception as exc:  # noqa: BLE001 - best effort
            log.debug("CLIENT UNBLOCK failed: %s", exc)
            return False
        return True

    async def pause(self, seconds: float) -> None:
        """Sleep, cut short by ``stopping``."""
        try:
            await asyncio.wait_for(self.stopping.wait(), seconds)
        except TimeoutError:  # on 3.11 a cancel racing the timeout can end up here: not swallowed
            raise_if_cancelling()

    def hold(self, counts: Mapping[bytes, int], until: float) -> None:
        """Deliver these in-flight entries again at ``until`` (``time.monotonic()``), each a new
        delivery after the given deliveries so far.  Their lease is not renewed meanwhile: hold
        for well under a lease (the watcher holds for a second)."""
        for eid, count in counts.items():
            self.in_flight.discard(eid)
            self.redeliver[eid] = (until, count)

    async def leave(self) -> None:
        """At a clean stop, remove this consumer's heartbeat, and the consumer from the group if
        it holds nothing pending; and the history counts not yet written."""
        if self.identity is not None or self.history:
            calls = self.history.take_calls(self.core.keys)
            if self.identity is not None:
                calls += leave_calls(self.core.keys, self.core.consumer_id)
            try:
                await self.driver.pipeline(calls)
            except Exception as exc:  # noqa: BLE001 - its beat lapses within LIVE_LEASES anyway
                log.info("%s: could not remove its heartbeat: %s", self.label, exc)
        if self.in_flight:
            return
        try:
            await self.reap(0, self.core.consumer_id)
        except Exception as exc:  # noqa: BLE001 - another consumer's janitor removes it later
            log.info("%s: could not remove its consumer: %s", self.label, exc)

    async def close(self) -> None:
        """Close the reader connection (the driver belongs to the caller)."""
        self.stopping.set()
        if self.reader is not None:
            await self.reader.aclose()
