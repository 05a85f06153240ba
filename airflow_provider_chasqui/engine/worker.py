"""``Worker``: the asyncio consumer, a superset of chasquimq's ``Worker``.

Theory of operation.  One *reader* task reads batches with XREADGROUP (and, every
``claim_min_idle_ms / 2``, recovers idle pending entries with XPENDING + XCLAIM, the Redis
7.0 stand-in for XREADGROUP CLAIM), runs the arrival gate, writes the batch's ``active``
events in one script call and appends the jobs to an in-process deque.  ``concurrency``
*slot* coroutines pop jobs and run the handler (async handlers on the loop, sync ones in a
thread pool).  A batch wakes one slot, and more only once that one yields (a handler
suspended): jobs that finish without suspending all run in the first slot, without waking
the others for nothing.  Successes are buffered and one *flusher* task acknowledges them up
to 256 at a time or every 5 ms with one script call that also writes ``completed`` events
and results (``lua/complete_batch.lua``).
Failures are buffered the same way: the flusher writes them up to ``ack_batch`` per script
call (``lua/fail_batch.lua``: per entry, the ack plus the retry via the delayed set or the
DLQ move, in the same script, so a job is never acked without being re-published).  Each
failed job is logged once at WARNING with its traceback (formatted on failure only: always for
a dead-lettered job, whose DLQ entry and failure record keep it, and for a retried attempt only
when it is logged, so a retry storm formats nothing past the budget), at most ``fail_log_burst`` per
``fail_log_window_secs``: beyond that they are counted and one line reports how many were
not logged, so a failure storm cannot flood the log.  The embedded promoter and scheduler
are leader-locked loops of their own.

Nothing is acknowledged before its handler finished, so a crash or a lost connection only
ever leaves entries pending; they are reclaimed after ``claim_min_idle_ms``, the lease: a
*lease* task renews it on every in-flight entry every tenth of it, in one ``renew_lease`` call
(XCLAIM JUSTID of the entries this consumer still owns), so the recovery of other workers
never takes a job whose worker lives, however long the job runs.  Entries found taken over
(this process was paused or cut off) are dropped if queued and never acked if running, and a
slot never starts a job while the renewal is overdue (``_lease_held``): it renews first.

Every task is supervised: an unexpected exception is logged with its traceback and the task
restarted after a backoff; :meth:`Worker.health` reports them.  A failure whose routing raises
is dead-lettered (``routing_failed``), so nothing ends a slot.  The reader also removes, every
5 leases, consumers idle for 10 with nothing pending; a clean stop removes this one.  ``close()``
stops reading (unblocking the pending read with CLIENT UNBLOCK), lets in-flight and buffered
jobs finish within ``shutdown_deadline_secs`` and flushes the acks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, cast

import msgpack
from redis import exceptions as rexc

from .. import tracing as _tracing
from ..core.calls import command, int_reply
from ..core.codec import now_ms
from ..core.consumer import (
    DECODE_FAILED,
    ROUTING_FAILED,
    UNDECODED,
    ConsumerCore,
    Delivery,
    Rejected,
    handler_traceback,
)
from ..core.features import Features
from ..core.retry import RetryPolicy
from ..core.settings import QueueSettings
from ..core.urls import with_tls
from ..drivers_common import translate_error
from ..errors import ClusterBusyError, CodecError, ConfigError, HandlerNotFound, NoGroupError, UnrecoverableError
from ..types import Job, new_job
from ._driver import AsyncDriver, raw_client
from .group import GroupConsumer
from .leader import TRANSIENT
from .promoter import Promoter

__all__ = ["Worker", "WorkerSettings", "Handler"]

log = logging.getLogger(__name__)
Handler = Callable[[Job], Any]
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_IO_MARGIN_SECS = 10.0  # socket timeout beyond the longest expected call (see Worker._run)
# A cluster failing over answers CLUSTERDOWN / TRYAGAIN / MASTERDOWN for a while: wait it out
# like a lost connection (an ack batch that gave up would strand its entries in _inflight).
_RETRYABLE = TRANSIENT + (rexc.ClusterDownError, rexc.TryAgainError, rexc.MasterDownError, ClusterBusyError)


@dataclass(slots=True)
class _TaskHealth:
    """One supervised role's record (a role can be many tasks: the slots)."""

    restarts: int = 0
    last_error: str = ""
    failed_at: float = 0.0
    backing_off: int = 0  # tasks of this role waiting to restart
    done: int = 0  # tasks of this role that returned


DEFAULT_CONCURRENCY = 100  # chasquimq's Worker default


def _retrieved(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


# The lease (claim_min_idle_ms) is renewed this many times per term, so a healthy worker's last
# renewal began at most a tenth of a lease ago, and a pause shorter than the remaining nine
# tenths never loses a running job (tests/faults/test_lease_pause.py).
RENEWALS_PER_LEASE = 10
# A slot renews before it starts a job when the last renewal began longer ago than this share
# of the lease (two renewals missed: a paused process, a blocked loop; see Worker._lease_held).
START_CHECK_FRACTION = 0.2


class LogBudget:
    """At most ``burst`` records per ``window`` seconds (fixed windows); the rest are counted,
    and the count of a window is handed back once, when the next window starts (or to
    :meth:`take_suppressed` at shutdown), for one "K not logged" line."""

    def __init__(self, burst: int, window: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.window, self._clock = burst, window, clock
        self._start = clock()
        self._used = 0
        self._suppressed = 0

    def take(self) -> tuple[bool, int]:
        """``(may log this record, records suppressed in the window that just ended)``."""
        now = self._clock()
        ended = 0
        if now - self._start >= self.window:
            ended = self.take_suppressed()
            self._start, self._used = now, 0
        if self._used < self.burst:
            self._used += 1
            return True, ended
        self._suppressed += 1
        return False, ended

    def take_suppressed(self) -> int:
        count, self._suppressed = self._suppressed, 0
        return count


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """Every worker knob, validated once.  Defaults follow chasquimq's Python ``Worker``."""

    concurrency: int = DEFAULT_CONCURRENCY
    max_attempts: int = 25
    group: str = "default"
    consumer_id: str | None = None
    read_block_ms: int = 5000
    read_count: int = 256
    claim_min_idle_ms: int = 30_000
    events_enabled: bool = True
    delayed_enabled: bool = True
    run_scheduler: bool = True
    scheduler_tick_ms: int = 1000
    promoter_poll_ms: int = 100
    store_results: bool = False
    result_ttl_ms: int = 24 * 3600 * 1000
    failure_ttl_ms: int = 24 * 3600 * 1000
    ack_batch: int = 256
    ack_idle_ms: int = 5
    shutdown_deadline_secs: float = 30.0
    sync_threads: int | None = None
    max_jobs: int | None = None
    idle_exit_secs: float | None = None
    fail_log_burst: int = 20
    fail_log_window_secs: float = 60.0
    retry: RetryPolicy = RetryPolicy()
    queue: QueueSettings = QueueSettings()

    def __post_init__(self) -> None:
        for name in (
            "concurrency",
            "read_block_ms",
            "read_count",
            "claim_min_idle_ms",
            "ack_batch",
            "scheduler_tick_ms",
            "promoter_poll_ms",
            "result_ttl_ms",
            "failure_ttl_ms",
            "fail_log_burst",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 0:
            raise ConfigError(f"max_attempts must be a non-negative int, got {self.max_attempts!r}")
        if self.max_jobs is not None and self.max_jobs <= 0:
            raise ConfigError("max_jobs must be positive")
        w = self.fail_log_window_secs
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < float("inf"):
            raise ConfigError(f"fail_log_window_secs must be a positive number of seconds, got {w!r}")


def _resolve_handler(handler: Any) -> Callable[[Job], Any] | _Dispatch:
    """A callable, or a mapping of job name -> callable (unknown names raise HandlerNotFound:
    dead-lettered)."""
    if isinstance(handler, Mapping):
        table = dict(handler)
        for key, fn in table.items():
            if not callable(fn):
                raise ConfigError(f"handler for job name {key!r} is not callable")
        return _Dispatch(table)
    if not callable(handler):
        raise ConfigError(
            f"handler must be callable or a mapping of job name to callable, got {type(handler).__name__}"
        )
    return cast("Callable[[Job], Any]", handler)


class _Dispatch:
    """Dispatch by job name; carries which handlers are coroutine functions."""

    def __init__(self, table: dict[str, Callable[[Job], Any]]) -> None:
        self.table = table

    def lookup(self, name: str) -> Callable[[Job], Any]:
        """The handler of job ``name``; ``HandlerNotFound`` (dead-lettered as unrecoverable) if none."""
        try:
            return self.table[name]
        except KeyError:
            raise HandlerNotFound.for_name(name) from None


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 - a callable object's own __call__


class Worker:
    """Consumes one queue.  Construct anywhere; ``await run()`` does all I/O.  Not thread-safe."""

    def __init__(
        self,
        queue_name: str,
        handler: Any,
        *,
        redis_url: str = "redis://127.0.0.1:6379",
        tls: bool = False,
        settings: WorkerSettings | None = None,
        fast_paths: bool | None = None,
        metrics: Any = None,
        install_signal_handlers: bool = False,
        concurrency: int = DEFAULT_CONCURRENCY,
        tracing: bool | None = None,
        **options: Any,
    ) -> None:
        self._handler = _resolve_handler(handler)
        if settings is None or concurrency != DEFAULT_CONCURRENCY:
            # chasquimq's signature (default 100, visible to inspect); a given ``settings`` keeps
            # its own concurrency unless this argument is passed with another value
            options["concurrency"] = concurrency
        settings = settings or WorkerSettings()
        self.settings = replace(settings, **_options_to_fields(options))
        redis_url = with_tls(redis_url, tls)  # ConfigError where TLS cannot apply (unix://)
        self._url = redis_url
        self._fast_paths = fast_paths
        self.metrics = metrics
        self._signals = install_signal_handlers
        s = self.settings
        self.consumer_id = s.consumer_id or f"c-{uuid.uuid4()}"
        self.core = ConsumerCore(
            queue_name,
            group=s.group,
            consumer_id=self.consumer_id,
            max_attempts=s.max_attempts,
            settings=s.queue,
            retry=s.retry,
            events=s.events_enabled,
            result_ttl_ms=s.result_ttl_ms if s.store_results else 0,
            failure_ttl_ms=s.failure_ttl_ms if s.store_results else 0,
        )
        # OpenTelemetry: a CONSUMER span per attempt when tracing=True (or CHASQUI_OTEL=1) and the
        # API imports; None otherwise, and the slots then never touch it
        self._tracer = _tracing.tracer(tracing)
        self.processed = 0
        self._running = False
        self._closed = False
        self._stopping: asyncio.Event | None = None
        self._done: asyncio.Event | None = None
        # the max_jobs stop's unblocking task: held so the loop cannot collect it half-way
        self._unblock_task: asyncio.Future[None] | None = None

    # ---- public lifecycle ---------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.core.keys.queue

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def run(self) -> None:
        """Consume until ``close()`` (or a signal, max_jobs, idle_exit); returns after the drain."""
        if self._running:
            assert self._done is not None
            await self._done.wait()
            return
        if self._closed:  # close() came first (or a previous run ended): nothing to do
            return
        self._running = True
        self._stopping, self._done = asyncio.Event(), asyncio.Event()
        try:
            await self._run()
        finally:
            self._running = False
            self._closed = True
            self._done.set()

    def health(self) -> dict[str, bool | str]:
        """Liveness of the worker's tasks, for a ``/healthz`` endpoint.

        Keys: ``"ok"`` (bool) is True while the worker runs, no task is waiting to restart
        after a crash, the reader is not stalled (no loop turn for ``read_block_ms`` + 20 s)
        and the lease renewal is not failing (the last full renewal is older than
        ``claim_min_idle_ms``); otherwise False.  Then one key per supervised role:
        ``"reader"``, ``"slots"``, ``"flusher"``, ``"lease"``, and ``"promoter"`` /
        ``"scheduler"`` when they run.  Its value is True while the role's tasks run and
        never crashed, else a string: ``"restarted N times; last error: <type>: <text>"``
        (running again), ``"restarting: ..."`` (waiting for its backoff), ``"stalled for
        Ns"`` (the reader) or ``"renewal late by Ns"`` (the lease).  While not consuming
        (before ``run()``, while it first reaches Redis, after it returns): ``{"ok": False,
        "running": self.is_running}``.
        """
        if not self._running or not hasattr(self, "_health"):
            return {"ok": False, "running": self._running}
        now = time.monotonic()
        out: dict[str, bool | str] = {"ok": True}
        for role, h in self._health.items():
            if h.backing_off:
                out[role] = f"restarting: {h.last_error}"
                out["ok"] = False
            elif h.restarts:
                out[role] = f"restarted {h.restarts} times; last error: {h.last_error}"
            else:
                out[role] = True
        stalled = now - self._beat
        if (
            "reader" in out
            and self._health["reader"].done == 0
            and stalled > self.settings.read_block_ms / 1000 + 2 * _IO_MARGIN_SECS
        ):
            out["reader"], out["ok"] = f"stalled for {stalled:.0f}s", False
        late = now - self._renewed_at - self.settings.claim_min_idle_ms / 1000
        if self._inflight and late > 0:
            out["lease"], out["ok"] = f"renewal late by {late:.1f}s", False
        return out

    async def close(self) -> None:
        """Ask the worker to stop; safe to call repeatedly and before ``run()``."""
        self._closed = True
        if self._stopping is not None and not self._stopping.is_set():
            self._stopping.set()
            await self._unblock_reader()

    async def __aenter__(self) -> Worker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- orchestration ----------------------------------------------------------------
    async def _run(self) -> None:
        assert self._stopping is not None
        s = self.settings
        # Socket timeouts, so a connection that goes silent (no FIN, no RST) cannot wedge a read
        # or an ack for ever; the longest call is XREADGROUP BLOCK read_block_ms.  A URL's own
        # socket_timeout / socket_connect_timeout win (redis-py lets URL options override).
        timeouts: dict[str, Any] = {
            "socket_timeout": s.read_block_ms / 1000 + _IO_MARGIN_SECS,
            "socket_connect_timeout": _IO_MARGIN_SECS,
        }
        self.driver = AsyncDriver(self._url, fast_paths=self._fast_paths, **timeouts)
        self._group = GroupConsumer(self.driver, self.core)
        self._reader_client = raw_client(self._url, single_connection_client=True, **timeouts)
        self._reader_client_id: int | None = None
        try:
            self._features: Features = await self._with_retry(self.driver.features)
            await self._with_retry(self._group.ensure_group)
        except _RETRYABLE:
            if not self._stopping.is_set():
                raise
            # close() before Redis was ever reachable: a clean stop, not a crash
            await self._reader_client.aclose()
            await self.driver.close()
            log.info("worker %s closed before Redis became reachable", self.consumer_id)
            return
        self._deque: collections.deque[Delivery] = collections.deque()
        self._idle: list[asyncio.Future[None]] = []
        self._inflight: set[bytes] = set()
        self._lost: dict[bytes, bytes] = {}  # in-flight entries another consumer took over -> its name
        self._renewed_at = time.monotonic()  # when the last renewal that covered every in-flight entry began
        self._start_renewal: asyncio.Future[None] | None = None  # one renewal shared by the slots that wait
        self._health: dict[str, _TaskHealth] = {}
        self._beat = time.monotonic()  # the reader's last loop iteration (stall detection)
        self._done_rows: list[tuple[Any, ...]] = []
        self._fail_rows: list[tuple[Any, ...]] = []  # fail_batch rows, and for the log of each:
        self._fail_info: list[tuple[Any, ...]] = []  # (job_id, name, attempt, outcome, delay, traceback or exc)
        self._fail_log = LogBudget(s.fail_log_burst, s.fail_log_window_secs)
        self._acking = 0  # entries of _inflight whose handler finished and whose ack is not yet done
        self._async_fns: dict[Any, bool] = {}
        self._flush_wanted = asyncio.Event()
        self._final_flush = False
        self._room_waiter: asyncio.Future[None] | None = None
        self._executor = ThreadPoolExecutor(
            max_workers=s.sync_threads or min(s.concurrency, 64), thread_name_prefix=f"chasqui-{self.name}"
        )
        loop = asyncio.get_running_loop()
        if self._signals:
            self._install_signals(loop)
        background = self._start_background()
        reader = self._supervised("reader", self._reader)
        slots = [self._supervised("slots", self._slot, f"chasqui-slot-{i}") for i in range(s.concurrency)]
        flusher = self._supervised("flusher", self._flusher)
        leaser = self._supervised("lease", self._leaser)
        log.info(
            "worker %s consuming %s (concurrency %d, xackdel %s)",
            self.consumer_id,
            self.name,
            s.concurrency,
            self._features.xackdel,
        )
        try:
            await self._stopping.wait()
        finally:
            await self._shutdown(reader, slots, flusher, background, leaser)

    def _start_background(self) -> list[tuple[Any, asyncio.Task[None]]]:
        s = self.settings
        loops: list[Any] = []
        if s.delayed_enabled:
            loops.append(
                Promoter(
                    self.driver,
                    self.name,
                    holder=self.consumer_id,
                    poll_interval_ms=s.promoter_poll_ms,
                    settings=s.queue,
                    events=s.events_enabled,
                    metrics=self.metrics,
                )
            )
        if s.run_scheduler:
            from .scheduler import Scheduler  # the scheduler pulls in cron maths only when used

            loops.append(
                Scheduler(self.driver, self.name, tick_ms=s.scheduler_tick_ms, settings=s.queue, metrics=self.metrics)
            )
        return [(lp, self._supervised(lp.role, lp.run)) for lp in loops]

    async def _shutdown(
        self,
        reader: asyncio.Task[None],
        slots: list[asyncio.Task[None]],
        flusher: asyncio.Task[None],
        background: list[tuple[Any, asyncio.Task[None]]],
        leaser: asyncio.Task[None],
    ) -> None:
        s = self.settings
        await self._unblock_reader()
        await asyncio.gather(reader, return_exceptions=True)
        for lp, _task in background:
            lp.stop()
        self._wake_all()
        _done, late = await asyncio.wait(slots, timeout=s.shutdown_deadline_secs)
        for task in late:  # their entries stay pending and are reclaimed later: nothing is lost
            task.cancel()
        if late:
            log.warning("worker %s: %d handlers still running at the shutdown deadline", self.consumer_id, len(late))
        await asyncio.gather(*late, return_exceptions=True)
        self._final_flush = True
        self._flush_wanted.set()
        await asyncio.gather(flusher, return_exceptions=True)
        leaser.cancel()  # the leases were renewed until the last ack was written
        await asyncio.gather(leaser, *(t for _lp, t in background), return_exceptions=True)
        await self._leave_group()
        suppressed = self._fail_log.take_suppressed()
        if suppressed:
            self._log_suppressed(suppressed)
        self._executor.shutdown(wait=False, cancel_futures=True)
        await self._reader_client.aclose()
        await self.driver.close()
        log.info("worker %s stopped after %d jobs", self.consumer_id, self.processed)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.close()))

    async def _with_retry(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Retry a call through Redis outages until it works or the worker is closing."""
        failures = 0
        while True:
            try:
                return await fn()
            except _RETRYABLE as exc:
                failures += 1
                if self._stopping is not None and self._stopping.is_set() and failures > 3:
                    raise
                delay = min(0.05 * 2 ** min(failures, 7), 5.0)
                log.warning("worker %s: Redis unavailable (%s); retry in %.2fs", self.consumer_id, exc, delay)
                await asyncio.sleep(delay)

    # ---- supervision ------------------------------------------------------------------
    def _metric(self, method: str, *args: Any) -> None:
        """Call an optional method of the metrics sink (a sink written for an older worker may
        lack it); metrics never decide anything, so a failing sink is only logged."""
        fn = getattr(self.metrics, method, None) if self.metrics is not None else None
        if fn is None:
            return
        try:
            fn(self.name, *args)
        except Exception:
            log.exception("worker %s: metrics failed", self.consumer_id)

    def _supervised(self, role: str, fn: Callable[[], Awaitable[None]], name: str | None = None) -> asyncio.Task[None]:
        if role not in self._health:
            self._metric("task_restarted", role, 0)  # the series exists, at 0, before a first restart
        self._health.setdefault(role, _TaskHealth())
        return asyncio.create_task(self._supervise(role, fn), name=name or f"chasqui-{role}")

    async def _supervise(self, role: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` until it returns; an unexpected exception is logged with its traceback
        and ``fn`` restarted after a backoff (0.1 s doubling to 5 s; reset after a minute
        without a crash).  Every loop re-reads its state on start, so a restart is safe."""
        h = self._health[role]
        streak = 0
        while True:
            try:
                await fn()
                h.done += 1
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # logged in full, then the task restarts
                now = time.monotonic()
                streak = streak + 1 if now - h.failed_at < 60 else 1
                h.restarts += 1
                h.failed_at = now
                self._metric("task_restarted", role, 1)
                h.last_error = f"{type(exc).__name__}: {exc}"[:300]
                delay = min(0.05 * 2 ** min(streak, 7), 5.0)
                log.error(
                    "worker %s: %s task failed; restarting in %.2fs", self.consumer_id, role, delay, exc_info=True
                )
                h.backing_off += 1
                try:
                    await asyncio.sleep(delay)
                finally:
                    h.backing_off -= 1

    # ---- leases -----------------------------------------------------------------------
    async def _leaser(self) -> None:
        """Renew the lease on every in-flight entry ``RENEWALS_PER_LEASE`` times per ``claim_min_idle_ms``.
        Runs until cancelled after the final ack flush (the drain keeps its leases)."""
        interval = self.settings.claim_min_idle_ms / 1000 / RENEWALS_PER_LEASE
        while True:
            await asyncio.sleep(max(0.0, self._renewed_at + interval - time.monotonic()))
            try:
                await self._renew()
            except _RETRYABLE as exc:
                log.warning("worker %s: lease renewal failed (%s); retrying", self.consumer_id, exc)
                await asyncio.sleep(min(interval, 1.0))

    async def _renew(self) -> None:
        """One ``renew_lease`` call (per 1,000 entries) for all in-flight entries; entries
        another consumer took over are marked lost (see :meth:`_lease_lost`)."""
        started = time.monotonic()
        ids = [eid for eid in self._inflight if eid not in self._lost] if self._lost else list(self._inflight)
        lost = await self._group.renew(ids)
        self._renewed_at = started
        if ids:
            self._metric("lease_renewed", len(ids) - len(lost))
        if lost:
            self._lease_lost(lost)

    def _lease_lost(self, lost: dict[bytes, bytes]) -> None:
        """Entries this worker held but no longer owns (it was paused or cut off for longer
        than the lease, and another worker reclaimed them, maybe ran and acked them already).
        Queued ones are dropped; running ones finish, and the flusher discards their outcome
        instead of acking an entry another worker is running (XACK does not check ownership)."""
        lost = {eid: owner for eid, owner in lost.items() if eid in self._inflight and eid not in self._lost}
        if not lost:
            return
        self._metric("lease_lost", len(lost))
        self._lost.update(lost)
        queued = [dl for dl in self._deque if dl.entry_id in lost]
        if queued:
            keep = [dl for dl in self._deque if dl.entry_id not in lost]
            self._deque.clear()  # in place: the slots hold this deque
            self._deque.extend(keep)
            for dl in queued:
                self._lost.pop(dl.entry_id, None)
                self._release(dl.entry_id)
        log.warning(
            "worker %s: lease lost on %d entries (first: %s, now held by %r); %d were still queued and are "
            "dropped, the outcome of the others will not be acked",
            self.consumer_id,
            len(lost),
            next(iter(lost)),
            next(iter(lost.values())) or "nobody (done)",
            len(queued),
        )

    def _drop_lost(self, rows: list[tuple[Any, ...]], at: int) -> list[tuple[Any, ...]]:
        """The rows whose entry this worker still owns; the others are released unwritten."""
        keep = []
        for row in rows:
            owner = self._lost.pop(row[at], None)
            if owner is None:
                keep.append(row)
            else:
                log.warning(
                    "worker %s: entry %s finished after its lease was lost to %r: outcome not recorded",
                    self.consumer_id,
                    row[at],
                    owner or "nobody (done)",
                )
                self._acking -= 1
                self._release(row[at])
        return keep

    def _forget_lost(self, rows: list[tuple[Any, ...]], at: int) -> None:
        for row in rows:
            self._lost.pop(row[at], None)

    async def _lease_held(self, dl: Delivery) -> bool:
        """Whether ``dl`` may start.  Asked only when the last renewal began more than
        ``START_CHECK_FRACTION`` of a lease ago (the renewer is late: the process was paused, or
        its event loop blocked, maybe past the whole lease while another worker ran the job):
        renew now and start the job only if this worker still owns its entry.  If the renewal
        cannot reach Redis the job does not start either; its entry stays pending and is
        reclaimed (by this worker or another) after the lease."""
        try:
            renewal = self._start_renewal
            if renewal is None or renewal.done():  # after a pause every slot asks at once: one call
                renewal = self._start_renewal = asyncio.ensure_future(self._renew())
                renewal.add_done_callback(_retrieved)  # its error is logged below, even if every asker left
            await asyncio.shield(renewal)
        except Exception as exc:  # noqa: BLE001 - unknown ownership: do not start, the entry stays pending
            log.warning(
                "worker %s: lease of job %s unknown (%s): not started, it is reclaimed after the lease",
                self.consumer_id,
                dl.envelope.id,
                exc,
            )
            self._release(dl.entry_id)
            return False
        if dl.entry_id in self._lost:  # _lease_lost() dropped the queued ones; this one was already taken
            owner = self._lost.pop(dl.entry_id)
            log.warning(
                "worker %s: job %s not started: its lease was lost to %r",
                self.consumer_id,
                dl.envelope.id,
                owner or "nobody (done)",
            )
            self._release(dl.entry_id)
            return False
        return True

    async def _check_lease(self) -> None:
        """Before acks are written: if no renewal began within half a lease (the process was
        paused, or Redis unreachable), renew first, so an entry taken over meanwhile is known lost."""
        if self._inflight and time.monotonic() - self._renewed_at > self.settings.claim_min_idle_ms / 2000:
            try:
                await self._renew()
            except Exception as exc:  # noqa: BLE001 - the acks' own retries handle an outage
                log.warning("worker %s: lease check before acking failed: %s", self.consumer_id, exc)

    async def _reap(self) -> None:
        """The janitor: remove consumers of the group with nothing pending and idle for 10
        leases (or 10 read blocks, if longer): workers that died or left without cleaning up."""
        s = self.settings
        try:
            gone = await self._group.reap(10 * max(s.claim_min_idle_ms, s.read_block_ms))
        except Exception as exc:  # noqa: BLE001 - housekeeping: tried again next time
            log.warning("worker %s: removing idle consumers failed: %s", self.consumer_id, exc)
            return
        if gone:
            log.info("worker %s removed %d idle consumers of %s: %s", self.consumer_id, len(gone), self.name, gone)

    async def _leave_group(self) -> None:
        """At a clean stop, remove this worker's consumer if it holds nothing pending."""
        if self._inflight:
            return
        try:
            await self._group.reap(0, self.consumer_id)
        except Exception as exc:  # noqa: BLE001 - the janitor of another worker removes it later
            log.info("worker %s: could not remove its consumer: %s", self.consumer_id, exc)

    # ---- reading ----------------------------------------------------------------------
    async def _unblock_reader(self) -> None:
        if getattr(self, "_reader_client_id", None) is None:
            return
        try:
            await self.driver.client.execute_command("CLIENT", "UNBLOCK", self._reader_client_id)
        except Exception as exc:  # noqa: BLE001 - best effort; the read ends at its BLOCK timeout anyway
            log.debug("CLIENT UNBLOCK failed: %s", exc)

    def _capacity(self) -> int:
        """At most ``concurrency + read_count`` entries waiting or running, plus up to as many
        again that finished and wait for their batched ack, so reading overlaps acking."""
        s = self.settings
        window = s.concurrency + s.read_count
        room = min(window - (len(self._inflight) - self._acking), 2 * window - len(self._inflight))
        if s.max_jobs is not None:  # never take more than the jobs left to run
            room = min(room, s.max_jobs - self.processed - (len(self._inflight) - self._acking))
        return room

    async def _reader(self) -> None:
        assert self._stopping is not None
        s = self.settings
        next_recovery = 0.0
        next_reap = time.monotonic() + 5 * s.claim_min_idle_ms / 1000
        busy = False
        idle_since = time.monotonic()
        failures = 0
        while not self._stopping.is_set():
            self._beat = time.monotonic()
            try:
                if self._reader_client_id is None:
                    self._reader_client_id = int_reply(await self._reader_client.execute_command("CLIENT", "ID"))
                if time.monotonic() >= next_recovery:
                    next_recovery = time.monotonic() + max(0.05, s.claim_min_idle_ms / 2000)
                    if await self._recover():
                        busy, idle_since = True, time.monotonic()
                    if time.monotonic() >= next_reap:
                        next_reap = time.monotonic() + 5 * s.claim_min_idle_ms / 1000
                        await self._reap()
                room = self._capacity()
                if room <= 0:
                    await self._wait_for_room()
                    continue
                if self._stopping.is_set():  # close() landed during recovery or the wait for room
                    break
                block = min(s.read_block_ms, self._block_budget_ms(next_recovery))
                reply = await self._reader_client.execute_command(*self.core.read(min(room, s.read_count), block).args)
                failures = 0
            except TRANSIENT as exc:
                if self._stopping.is_set():
                    break
                failures += 1
                self._reader_client_id = None
                delay = min(0.05 * 2 ** min(failures, 7), 5.0)
                log.warning("worker %s: read failed (%s); reconnecting in %.2fs", self.consumer_id, exc, delay)
                await asyncio.sleep(delay)
                continue
            except Exception as exc:  # noqa: BLE001 - NOGROUP after the stream was deleted, etc.
                if isinstance(translate_error(exc), NoGroupError):  # the reader is a raw client
                    await self._with_retry(self._group.ensure_group)
                    continue
                log.error("worker %s: read error %s", self.consumer_id, exc)
                await asyncio.sleep(0.2)
                continue
            entries = reply[0][1] if reply else []
            if entries:
                busy, idle_since = True, time.monotonic()
                ready, rejected = self.core.gate_fresh(entries)
                await self._admit(ready, rejected)
                await asyncio.sleep(0)  # let the woken slots start before the next read is sized
            else:
                if busy:
                    busy = False
                    await self._emit(self.core.drained_event(now_ms()))
                if (
                    s.idle_exit_secs is not None
                    and not self._deque
                    and not self._inflight
                    and time.monotonic() - idle_since >= s.idle_exit_secs
                ):
                    log.info("worker %s idle for %.1fs; exiting", self.consumer_id, s.idle_exit_secs)
                    self._stopping.set()

    def _block_budget_ms(self, next_recovery: float) -> int:
        budget = int((next_recovery - time.monotonic()) * 1000)
        if self.settings.idle_exit_secs is not None:
            budget = min(budget, int(self.settings.idle_exit_secs * 1000))
        return max(1, budget)

    async def _wait_for_room(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._room_waiter = fut
        try:
            await asyncio.wait_for(fut, 0.5)
        except TimeoutError:
            pass
        finally:
            self._room_waiter = None

    async def _recover(self) -> bool:
        """Claim entries idle longer than ``claim_min_idle_ms`` (crashed or stuck consumers)."""
        s = self.settings
        room = self._capacity()
        if room <= 0:
            return False
        batch = await self._group.claim_idle(s.claim_min_idle_ms, min(room, s.read_count), self._inflight)
        if batch:
            log.info("worker %s reclaimed %d idle entries", self.consumer_id, len(batch))
            await self._admit(*self.core.gate_rows(batch))
        return bool(batch)

    async def _admit(self, ready: list[Delivery], rejected: list[Rejected]) -> None:
        """Write the ``active`` events of the ready jobs in one script call and hand them to
        the slots, then dead-letter what the arrival gate refused.  The jobs come first: if the
        dead-lettering fails for good (and ends the reader, which is restarted), they run
        anyway, and the refused entries stay pending, to be reclaimed and tried again."""
        if ready:
            if self.metrics is not None:
                self.metrics.batch(self.name, len(ready))
            await self._emit(self.core.active_events_compact(ready, now_ms()))
            self._inflight.update([dl.entry_id for dl in ready])
            self._deque.extend(ready)
            self._wake(1)
            if len(ready) > 1:
                asyncio.get_running_loop().call_soon(self._top_up)
        if rejected:
            await self._reject(rejected)

    def _top_up(self) -> None:
        """Runs once the slot woken for a batch first yields: wakes a slot per job still queued.
        When handlers finish without suspending, that one slot runs the whole batch and the
        others stay parked (waking every idle slot per batch cost ~1 us a job)."""
        self._wake(len(self._deque))

    async def _emit(self, call: Any) -> None:
        """Events are best effort: a failure is logged, never fatal (as in ChasquiMQ)."""
        if call is None:
            return
        try:
            await self.driver.call(call)
        except Exception as exc:  # noqa: BLE001
            log.warning("worker %s: events write failed: %s", self.consumer_id, exc)

    async def _reject(self, rejected: list[Rejected]) -> None:
        """Dead-letter what the arrival gate refused, in one script call (entries never admitted)."""
        for r in rejected:  # within the failure log's budget: a flood of foreign entries is counted, not logged
            ok, suppressed = self._fail_log.take()
            if suppressed:
                self._log_suppressed(suppressed)
            if ok:
                log.error(
                    "worker %s: entry %s of %s dead-lettered: %s %s",
                    self.consumer_id,
                    r.entry_id,
                    self.name,
                    r.reason,
                    r.detail,
                    extra={"queue": self.name, "job_id": r.job_id or None},
                )
        rows = [self.core.reject_row(r) for r in rejected]
        await self._with_retry(lambda: self._group.fail(rows, self._features, now_ms()))
        if self.metrics is not None:
            for r in rejected:
                self.metrics.job_dead(self.name, r.name, r.reason)

    # ---- handler slots ----------------------------------------------------------------
    def _wake(self, n: int) -> None:
        while n > 0 and self._idle:
            fut = self._idle.pop()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    def _wake_all(self) -> None:
        self._wake(len(self._idle))

    async def _slot(self) -> None:
        """Run queued jobs one after another until the deque is empty, then park.  The success
        path is inline (a coroutine per job for it cost about a tenth of the worker's CPU)."""
        assert self._stopping is not None
        loop = asyncio.get_running_loop()
        queue, stopping, idle, rows = self._deque, self._stopping, self._idle, self._done_rows
        s = self.settings
        store, ack_batch, metrics, name = s.store_results, s.ack_batch, self.metrics, self.name
        # a _Dispatch is only ever called through ``dispatch.lookup`` below
        handler = cast("Callable[[Job], Any]", self._handler)
        dispatch = handler if isinstance(handler, _Dispatch) else None
        async_fns = self._async_fns
        clock = time.perf_counter_ns
        max_jobs = s.max_jobs
        me = asyncio.current_task()
        tracer = self._tracer
        span = token = None
        lease_check = s.claim_min_idle_ms / 1000 * START_CHECK_FRACTION
        monotonic = time.monotonic
        while True:
            debug = log.isEnabledFor(logging.DEBUG)  # once per wake-up, not per job
            while queue:
                dl = queue.popleft()
                if monotonic() - self._renewed_at > lease_check and not await self._lease_held(dl):
                    continue
                data = dl.data
                if data is UNDECODED:  # decoded only now: the read-ahead window holds bytes (issue 26)
                    try:
                        data = dl.payload()
                    except CodecError as exc:
                        self._undecodable(dl, exc)
                        continue
                env = dl.envelope
                if debug:
                    log.debug(
                        "job %s %s attempt %d started",
                        env.id,
                        dl.name,
                        env.attempt + 1,
                        extra={"queue": name, "job_id": env.id, "job_name": dl.name, "attempt": env.attempt + 1},
                    )
                if tracer is not None:
                    span, token = await self._start_span(tracer, dl)
                start = clock()
                try:  # everything that can raise before the outcome is buffered is in here
                    job = new_job(env.id, dl.name, data, env.attempt, env.created_at_ms)
                    fn = handler if dispatch is None else dispatch.lookup(dl.name)
                    try:
                        is_async = async_fns[fn]
                    except (KeyError, TypeError):  # TypeError: an unhashable callable, never cached
                        is_async = _is_async(fn)
                        with contextlib.suppress(TypeError):
                            async_fns[fn] = is_async
                    result = await (fn(job) if is_async else self._call(fn, job))
                except BaseException as exc:  # every handler failure is routed, none escapes
                    if isinstance(exc, asyncio.CancelledError) and me is not None and me.cancelling():
                        # our own cancellation (the shutdown deadline): the entry stays pending, unrenewed,
                        # and is reclaimed after claim_min_idle_ms.  A handler's own CancelledError is a failure.
                        self._release(dl.entry_id)
                        if span is not None and tracer is not None:
                            tracer.end_consume(span, token, "cancelled")
                        raise
                    outcome = self._failed(dl, exc, (clock() - start) // 1000)
                    if span is not None and tracer is not None:
                        await self._end_failed_span(tracer, span, token, dl, outcome, exc)
                    continue
                if store:
                    try:
                        encoded = _packb(result)
                    except Exception as exc:  # noqa: BLE001 - the handler ran: never run it again for this
                        err = UnrecoverableError(f"handler result cannot be stored: {exc!r}")
                        outcome = self._failed(dl, err, (clock() - start) // 1000)
                        if span is not None and tracer is not None:
                            await self._end_failed_span(tracer, span, token, dl, outcome, err)
                        continue
                else:
                    encoded = b""
                duration_us = (clock() - start) // 1000
                if span is not None and tracer is not None:
                    tracer.end_consume(span, token, "completed")
                rows.append((dl.entry_id, env.id, dl.name, env.attempt + 1, duration_us, encoded))
                self._acking += 1
                if len(rows) == 1 or len(rows) >= ack_batch:
                    self._flush_wanted.set()
                waiter = self._room_waiter  # a finished job frees reading room (see _capacity)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
                if metrics is not None:
                    metrics.job_completed(name, dl.name, duration_us / 1e6)
                if max_jobs is None:
                    self.processed += 1
                else:
                    self._count_processed()
            if stopping.is_set():
                return
            fut = loop.create_future()
            idle.append(fut)
            await fut

    async def _start_span(self, tracer: _tracing.Tracer, dl: Delivery) -> tuple[Any, Any]:
        """The CONSUMER span of one attempt.  A retried attempt (no ``tp`` field: it came back
        through the delayed set) finds its producer's context and the failed attempt's span in
        the side key the worker wrote when it scheduled the retry (one GET, tracing on only)."""
        env, parent, previous = dl.envelope, dl.trace, None
        if not parent and env.attempt > 0:
            try:
                saved = await self.driver.call(command("GET", self.core.keys.trace(env.id)))
            except Exception:  # noqa: BLE001 - tracing never decides a job's fate
                saved = None
            if isinstance(saved, bytes):
                parent, _, previous = saved.partition(b" ")
                dl.trace = parent  # a further retry keeps it too
        try:
            return tracer.start_consume(self.name, env.id, dl.name, env.attempt + 1, parent, previous)
        except Exception:
            log.exception("worker %s: starting a span failed", self.consumer_id)
            return None, None

    async def _end_failed_span(
        self, tracer: _tracing.Tracer, span: Any, token: Any, dl: Delivery, outcome: str, exc: BaseException
    ) -> None:
        """End a failed attempt's span; on a retry, keep the trace for the next attempt (expires
        after ``TRACE_KEY_TTL_MS``: a longer backoff starts a new trace)."""
        if outcome == "retry":
            parent = dl.trace
            this = tracer.traceparent(tracer.api.trace.set_span_in_context(span))
            if parent and this:
                try:
                    await self.driver.call(
                        command(
                            "SET",
                            self.core.keys.trace(dl.envelope.id),
                            parent + b" " + this.encode(),
                            "PX",
                            _tracing.TRACE_KEY_TTL_MS,
                        )
                    )
                except Exception:  # noqa: BLE001 - tracing never decides a job's fate
                    log.debug("worker %s: could not keep the trace of job %s", self.consumer_id, dl.envelope.id)
        tracer.end_consume(span, token, outcome, exc)

    async def _call(self, fn: Callable[[Job], Any], job: Job) -> Any:
        if _is_async(fn):
            return await fn(job)
        loop = asyncio.get_running_loop()
        if self._tracer is not None:  # the executor thread sees the job's span as current
            result = await loop.run_in_executor(self._executor, contextvars.copy_context().run, fn, job)
        else:
            result = await loop.run_in_executor(self._executor, fn, job)
        if inspect.isawaitable(result):
            result = await result
        return result

    def _failed(self, dl: Delivery, exc: BaseException, duration_us: int) -> str:
        """Buffer a failure for the flusher (like a success row); the entry stays in flight,
        pending in Redis, until the batch that retries or dead-letters it is written.

        Total: if deciding the route raises (a hostile retry override, an exception whose
        ``repr`` raises...), the entry is dead-lettered with reason ``routing_failed`` and the
        error as detail; nothing raised here can end a slot."""
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
        self._fail_rows.append(row)
        # a dead-lettered row carries its formatted traceback; a retried one is formatted (~0.1-1 ms)
        # only if the log budget lets it be logged, so a retry storm costs no formatting
        self._fail_info.append((env.id, dl.name, env.attempt + 1, outcome, delay, row[11] if row[0] == "d" else exc))
        self._acking += 1
        if len(self._fail_rows) == 1 or len(self._fail_rows) >= self.settings.ack_batch:
            self._flush_wanted.set()
        if self.metrics is not None:
            try:
                self.metrics.job_failed(self.name, dl.name)
                if outcome == "retry":
                    self.metrics.job_retried(self.name, dl.name)
                else:
                    self.metrics.job_dead(self.name, dl.name, outcome)
            except Exception:  # metrics never decide a job's fate
                log.exception("worker %s: metrics failed", self.consumer_id)
        self._count_processed()
        return outcome

    def _undecodable(self, dl: Delivery, exc: CodecError) -> None:
        """Dead-letter ``dl`` as ``decode_failed`` (its data is not msgpack, or would expand far
        past its size): buffered for the flusher like a failure; no handler ran."""
        row = self.core.reject_row(self.core.undecodable(dl, exc))
        self._fail_rows.append(row)
        self._fail_info.append((dl.envelope.id, dl.name, dl.envelope.attempt + 1, DECODE_FAILED, 0, str(exc)))
        self._acking += 1
        if len(self._fail_rows) == 1 or len(self._fail_rows) >= self.settings.ack_batch:
            self._flush_wanted.set()
        if self.metrics is not None:
            try:
                self.metrics.job_dead(self.name, dl.name, DECODE_FAILED)
            except Exception:  # metrics never decide a job's fate
                log.exception("worker %s: metrics failed", self.consumer_id)
        self._count_processed()

    def _release(self, entry_id: bytes) -> None:
        self._inflight.discard(entry_id)
        waiter = getattr(self, "_room_waiter", None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _count_processed(self) -> None:
        self.processed += 1
        limit = self.settings.max_jobs
        if limit is not None and self.processed >= limit and self._stopping is not None and not self._stopping.is_set():
            log.info("worker %s reached max_jobs=%d", self.consumer_id, limit)
            self._stopping.set()
            self._unblock_task = asyncio.ensure_future(self._unblock_reader())

    # ---- acknowledgements -------------------------------------------------------------
    async def _flusher(self) -> None:
        """Batch acks: up to ``ack_batch`` rows or ``ack_idle_ms`` after the first one."""
        assert self._stopping is not None
        s = self.settings
        lease_check = s.claim_min_idle_ms / 2000  # see _check_lease
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            # Wait up to ack_idle_ms for more rows only while handlers are queued or running;
            # with none left, waiting would only delay the acks.
            if (
                len(self._done_rows) < s.ack_batch
                and len(self._fail_rows) < s.ack_batch
                and not self._final_flush
                and (self._deque or len(self._inflight) > self._acking)
            ):
                await asyncio.sleep(s.ack_idle_ms / 1000)
            if self._inflight and time.monotonic() - self._renewed_at > lease_check:  # inline: once per flush
                await self._check_lease()
            while self._fail_rows:
                await self._flush_failures()
            while self._done_rows:
                rows = self._done_rows[: s.ack_batch]
                del self._done_rows[: s.ack_batch]  # in place: the slots append to this list
                if self._lost:
                    rows = self._drop_lost(rows, 0)
                    if not rows:
                        continue

                def ack(rows: list[tuple[Any, ...]] = rows) -> Awaitable[None]:
                    return self._group.complete(rows, self._features, now_ms())

                try:
                    await self._with_retry(ack)
                except Exception as exc:  # noqa: BLE001 - see _unacked
                    self._unacked(len(rows), exc)
                finally:
                    self._acking -= len(rows)
                self._inflight.difference_update([row[0] for row in rows])  # _release() of each row, batched
                self._release(rows[0][0])  # already discarded: this only wakes a reader waiting for room
                if self._lost:  # marked lost by a renewal that ran while this batch was acked
                    self._forget_lost(rows, 0)
            if self._final_flush:
                if self._fail_rows or self._done_rows:  # written while the others were
                    self._flush_wanted.set()
                    continue
                return

    def _unacked(self, n: int, exc: BaseException) -> None:
        """A batch that could not be written stays pending in Redis; releasing its entries
        (the caller does) lets recovery reclaim them after ``claim_min_idle_ms`` and re-run
        them (at-least-once), and the flusher lives on for the next batches."""
        log.error(
            "worker %s: %d acks not written (%s); the entries stay pending and will be reclaimed",
            self.consumer_id,
            n,
            exc,
        )

    async def _flush_failures(self) -> None:
        """Write up to ``ack_batch`` buffered failures in one ``fail_batch`` call."""
        n = self.settings.ack_batch
        rows, info = self._fail_rows[:n], self._fail_info[:n]
        del self._fail_rows[:n], self._fail_info[:n]
        if self._lost:
            kept = set(map(id, self._drop_lost(rows, 1)))
            info = [i for row, i in zip(rows, info) if id(row) in kept]
            rows = [row for row in rows if id(row) in kept]
            if not rows:
                return
        try:
            await self._with_retry(lambda: self._group.fail(rows, self._features, now_ms()))
        except Exception as exc:  # noqa: BLE001 - see _unacked
            self._unacked(len(rows), exc)
        finally:
            self._acking -= len(rows)
        self._inflight.difference_update([row[1] for row in rows])
        self._release(rows[0][1])  # already discarded: this only wakes a reader waiting for room
        if self._lost:
            self._forget_lost(rows, 1)
        self._log_failures(rows, info)

    def _log_failures(self, rows: list[tuple[Any, ...]], info: list[tuple[Any, ...]]) -> None:
        """One WARNING per failed job, with its traceback, within the log budget (see the
        module docstring); the records carry ``queue``, ``job_id``, ``job_name`` and
        ``attempt`` for structured log formats."""
        budget = self._fail_log
        for row, (job_id, name, attempt, outcome, delay, tb) in zip(rows, info):
            ok, suppressed = budget.take()
            if suppressed:
                self._log_suppressed(suppressed)
            if not ok:
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
                row[5],
                then,
                "\n" + tb.rstrip("\n") if tb else "",
                extra={"queue": self.name, "job_id": job_id, "job_name": name, "attempt": attempt},
            )

    def _log_suppressed(self, count: int) -> None:
        s = self.settings
        log.warning(
            "worker %s: %d more failed jobs or refused entries not logged (at most %d per %gs)",
            self.consumer_id,
            count,
            s.fail_log_burst,
            s.fail_log_window_secs,
            extra={"queue": self.name},
        )


_OPTION_FIELDS = {
    "concurrency",
    "max_attempts",
    "group",
    "consumer_id",
    "read_block_ms",
    "read_count",
    "claim_min_idle_ms",
    "events_enabled",
    "delayed_enabled",
    "run_scheduler",
    "scheduler_tick_ms",
    "promoter_poll_ms",
    "store_results",
    "result_ttl_ms",
    "failure_ttl_ms",
    "ack_batch",
    "ack_idle_ms",
    "shutdown_deadline_secs",
    "sync_threads",
    "max_jobs",
    "idle_exit_secs",
    "fail_log_burst",
    "fail_log_window_secs",
    "retry",
}
_QUEUE_FIELDS = {
    "max_payload_bytes": "max_payload_bytes",
    "dlq_max_stream_len": "dlq_max_len",
    "max_stream_len": "max_stream_len",
    "events_max_stream_len": "events_max_len",
    "results_max_len": "results_max_len",
    "failures_max_len": "failures_max_len",
}


def _options_to_fields(options: dict[str, Any]) -> dict[str, Any]:
    """chasquimq's keyword arguments (``None`` = default) onto ``WorkerSettings`` fields."""
    out: dict[str, Any] = {}
    queue: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key == "result_ttl":
            out["result_ttl_ms"] = (
                int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value * 1000)
            )
        elif key in _QUEUE_FIELDS:
            queue[_QUEUE_FIELDS[key]] = value
        elif key in _OPTION_FIELDS:
            out[key] = value
        else:
            raise ConfigError(f"unknown Worker option {key!r}")
    if queue:
        out["queue"] = QueueSettings(**queue)
    return out
