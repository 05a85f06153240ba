"""``Worker``: the asyncio consumer, a superset of chasquimq's ``Worker``.

Theory of operation.  One *reader* task takes batches from the consumer intake
(``engine/intake.py``: XREADGROUP, recovery of idle pending entries, the arrival gate and its
dead-lettering, leases), writes the batch's ``active`` events in one script call and appends the
jobs to an in-process deque.  ``concurrency``
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
ever leaves entries pending; they are reclaimed after ``claim_min_idle_ms``, the lease (plus one
renewal interval), which the intake renews on every in-flight entry ten times per term, so the
recovery of other workers never takes a job whose worker lives, however long the job runs; while
a handler blocks the event loop a thread renews them (``engine/lease_guard.py``).  Each attempt
runs under its timeout, if one applies (``core/running.py``).  Entries found taken over (this
process was paused or cut off) are dropped if queued and never acked if running, and a slot never
starts a job while the renewal is overdue (``Intake.lease_held``): it renews first.

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
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

import msgpack

from .. import tracing as _tracing
from ..core.calls import command
from ..core.codec import now_ms
from ..core.consumer import (
    DECODE_FAILED,
    ROUTING_FAILED,
    UNDECODED,
    ConsumerCore,
    Delivery,
    handler_traceback,
)
from ..core.pacing import Backoff, LogBudget
from ..core.rows import COMPLETE_ENTRY_ID, FAIL_ENTRY_ID, FAIL_KIND, FAIL_REASON, FAIL_TRACEBACK
from ..core.running import CANCEL_POLL_SECS, handler_batch, handler_timeout
from ..core.urls import DEFAULT_URL, with_tls
from ..errors import (
    TRANSIENT_ERRORS,
    CodecError,
    ConfigError,
    HandlerNotFound,
    JobTimeout,
    RateLimited,
    UnrecoverableError,
)
from ..types import Job, new_job
from ._driver import AsyncDriver, raw_client
from .cancellation import raise_if_cancelling
from .identity import consumer_name, identity, package_version
from .intake import START_CHECK_FRACTION, Intake
from .lease_guard import LeaseGuard
from .metrics import NO_METRICS, metrics_sink
from .progress import ProgressReporter
from .promoter import Promoter
from .supervision import STOP_GRACE_SECS, Supervisor, settle_tasks
from .worker_settings import DEFAULT_CONCURRENCY, WorkerSettings, options_to_fields

if TYPE_CHECKING:
    from .process_pool import Call, Outcomes, ProcessPool

__all__ = ["Worker", "WorkerSettings", "Handler", "LogBudget"]

log = logging.getLogger(__name__)
Handler = Callable[[Job], Any]
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
POOL_RUN = 32  # pool calls a slot has out at once (see _slot)
_IO_MARGIN_SECS = 10.0  # socket timeout beyond the longest expected call (see Worker._run)


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
        redis_url: str = DEFAULT_URL,
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
        self.settings = replace(settings, **options_to_fields(options))
        # handlers in child processes: checked here (they must pickle by name), spawned by run();
        # imported only then, so a worker without a pool loads neither multiprocessing nor pickle
        self._procs: ProcessPool | None = None
        if self.settings.processes:
            from .process_pool import ProcessPool

            self._procs = ProcessPool(
                self.settings.processes,
                handler,
                memory_mb=self.settings.process_memory_mb,
                label=f"worker of {queue_name!r}",
            )
        redis_url = with_tls(redis_url, tls)  # ConfigError where TLS cannot apply (unix://)
        self._url = redis_url
        self._fast_paths = fast_paths
        self.metrics = metrics  # the sink as given; the engine reports through self._sink
        self._sink = metrics_sink(metrics)
        self._signals = install_signal_handlers
        s = self.settings
        self.consumer_id = s.consumer_id or consumer_name()  # c-<host>-<pid>-<8 hex>
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
        ``"reader"``, ``"slots"``, ``"flusher"``, ``"lease"``, ``"cancels"``, ``"progress"``, and ``"promoter"`` /
        ``"scheduler"`` when they run.  Its value is True while the role's tasks run and
        never crashed, else a string: ``"restarted N times; last error: <type>: <text>"``
        (running again), ``"restarting: ..."`` (waiting for its backoff), ``"stalled for
        Ns"`` (the reader) or ``"renewal late by Ns"`` (the lease).  While not consuming
        (before ``run()``, while it first reaches Redis, after it returns): ``{"ok": False,
        "running": self.is_running}``.
        """
        if not self._running or not hasattr(self, "_tasks"):
            return {"ok": False, "running": self._running}
        now = time.monotonic()
        out: dict[str, bool | str] = self._tasks.report()
        stalled = now - self._beat
        if (
            "reader" in out
            and self._tasks.roles["reader"].done == 0
            and stalled > self.settings.read_block_ms / 1000 + 2 * _IO_MARGIN_SECS
        ):
            out["reader"], out["ok"] = f"stalled for {stalled:.0f}s", False
        late = now - self._intake.renewed_at - self.settings.claim_min_idle_ms / 1000
        if self._intake.in_flight and late > 0:
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
        self._fail_log = LogBudget(s.fail_log_burst, s.fail_log_window_secs)
        self._intake = Intake(
            self.driver,
            self.core,
            lease_ms=s.claim_min_idle_ms,
            reader=raw_client(self._url, single_connection_client=True, **timeouts),
            stopping=self._stopping,
            log_budget=self._fail_log,
            metrics=self._sink,
            on_lost=self._lease_lost,
            label=f"worker {self.consumer_id}",
            priority_batch=s.concurrency,
        )
        try:
            await self._with_retry(self._intake.open)
        except TRANSIENT_ERRORS:
            if not self._stopping.is_set():
                raise
            # close() before Redis was ever reachable: a clean stop, not a crash
            await self._intake.close()
            await self.driver.close()
            log.info("worker %s closed before Redis became reachable", self.consumer_id)
            return
        self._run_state()
        if self._procs is not None:
            try:
                await self._procs.start(self._progress)
            except BaseException:
                await self._intake.close()
                await self.driver.close()
                raise
        loop = asyncio.get_running_loop()
        if self._signals:
            self._install_signals(loop)
        self._intake.identity = identity(
            handlers=list(self._handler.table) if isinstance(self._handler, _Dispatch) else ["*"],
            concurrency=s.concurrency,
            started_ms=now_ms(),
            lease_ms=s.claim_min_idle_ms,
            version=package_version(),
        )
        self._intake.healthy = lambda: bool(self.health().get("ok"))
        self._guard = LeaseGuard(self._intake, self._url, loop, **timeouts).start()  # leases whole, loop blocked
        background = self._start_background()
        reader = self._tasks.start("reader", self._reader)
        slots = [self._tasks.start("slots", self._slot, f"chasqui-slot-{i}") for i in range(s.concurrency)]
        flusher = self._tasks.start("flusher", self._flusher)
        leaser = self._tasks.start("lease", self._intake.run_leases)
        background.append((None, self._tasks.start("cancels", self._watch_cancels)))
        background.append((None, self._tasks.start("progress", self._progress.run)))
        log.info(
            "worker %s consuming %s (concurrency %d%s, xackdel %s)",
            self.consumer_id,
            self.name,
            s.concurrency,
            f", handlers in {s.processes} processes" if s.processes else "",
            self._intake.features.xackdel,
        )
        try:
            await self._stopping.wait()
        finally:
            await self._shutdown(reader, slots, flusher, background, leaser)

    def _run_state(self) -> None:
        """The state of one run, made once Redis answered."""
        s = self.settings
        self._deque: collections.deque[Delivery] = collections.deque()
        self._idle: list[asyncio.Future[None]] = []
        self._tasks = Supervisor(f"worker {self.consumer_id}", self.name, self._sink)
        self._beat = time.monotonic()  # the reader's last loop iteration (stall detection)
        self._done_rows: list[tuple[Any, ...]] = []
        self._fail_rows: list[tuple[Any, ...]] = []  # fail_batch rows, and for the log of each:
        self._fail_info: list[tuple[Any, ...]] = []  # (job_id, name, attempt, outcome, delay, traceback or exc)
        self._acking = 0  # entries in flight whose handler finished and whose ack is not yet done
        self._async_fns: dict[Any, bool] = {}
        self._fn_timeouts: dict[Any, int] = {}  # handlers with their own timeout (core/running.py)
        self._fn_batches: dict[Any, int] = {}  # batch handlers and their size (core/running.py)
        self._abandoned = 0  # pool threads left running a timed-out or cancelled plain handler
        self._current: dict[Any, Delivery | None] = {}  # slot task -> the job whose handler it awaits
        self._cancel_target: dict[Any, Delivery] = {}  # slot task -> the job Queue.cancel stops in it
        self._pooled: dict[Call, tuple[Delivery, int]] = {}  # pool calls out, not settled -> (job, start ns)
        self._box_waiting: list[Outcomes] = []  # slots awaiting pool calls, with room for more
        self._flush_wanted = asyncio.Event()
        self._final_flush = False
        self._room_waiter: asyncio.Future[None] | None = None
        self._emits: set[asyncio.Task[None]] = set()  # `active` events in flight (_admit)
        self._progress = ProgressReporter(self.driver, self.core.keys, self.core.events_max, self.consumer_id)
        self._pool_size = s.sync_threads or min(s.concurrency, 64)
        self._executor = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix=f"chasqui-{self.name}")

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
                    metrics=self._sink,
                )
            )
        if s.run_scheduler:
            from .scheduler import Scheduler  # the scheduler pulls in cron maths only when used

            loops.append(
                Scheduler(self.driver, self.name, tick_ms=s.scheduler_tick_ms, settings=s.queue, metrics=self._sink)
            )
        return [(lp, self._tasks.start(lp.role, lp.run)) for lp in loops]

    async def _shutdown(
        self,
        reader: asyncio.Task[None],
        slots: list[asyncio.Task[None]],
        flusher: asyncio.Task[None],
        background: list[tuple[Any, asyncio.Task[None]]],
        leaser: asyncio.Task[None],
    ) -> None:
        s = self.settings
        label = f"worker {self.consumer_id}"
        # every step is bounded: a stop ends even when Redis went silent (a paused server)
        grace = min(STOP_GRACE_SECS, max(1.0, s.shutdown_deadline_secs))
        await self._within(self._intake.unblock(), "its reader's unblock", grace)
        await settle_tasks([reader], label, cancel=False, grace=grace)
        for lp, task in background:
            if lp is None:
                task.cancel()
            else:
                lp.stop()
        self._wake_all()
        _done, late = await asyncio.wait(slots, timeout=s.shutdown_deadline_secs)
        if late:  # their entries stay pending and are reclaimed later: nothing is lost
            log.warning("%s: %d handlers still running at the shutdown deadline", label, len(late))
            await settle_tasks(list(late), label, cancel=True, grace=grace)
        if self._procs is not None:
            await self._procs.close()
        await self._within(self._progress.flush(), "the last progress reports", grace)  # before the outcomes
        self._final_flush = True
        self._flush_wanted.set()
        # the acks of every handler that finished; past the grace their entries stay pending and
        # are reclaimed after the lease (run again, never at once: the leases stop with us)
        await settle_tasks([flusher], label, cancel=False, grace=max(grace, s.claim_min_idle_ms / 1000))
        for task in tuple(self._emits):  # only left when Redis went silent: events are best effort
            task.cancel()
        self._guard.stop()
        # the leases were renewed until the last ack was written; background loops end here
        await settle_tasks([leaser], label, cancel=True, grace=grace)
        await settle_tasks([t for _lp, t in background], label, cancel=False, grace=grace)
        # a clean stop's goodbye; without it the heartbeat lapses and a janitor reaps us
        await self._within(self._intake.leave(), "its leave", grace)
        suppressed = self._fail_log.take_suppressed()
        if suppressed:
            self._intake.log_suppressed(suppressed)
        self._executor.shutdown(wait=False, cancel_futures=True)
        await self._within(self._intake.close(), "closing its reader", grace)
        await self._within(self.driver.close(), "closing its connections", grace)
        log.info("worker %s stopped after %d jobs", self.consumer_id, self.processed)

    async def _within(self, aw: Awaitable[Any], what: str, grace: float) -> None:
        """``aw``, given up (with a warning) after ``grace`` seconds."""
        try:
            await asyncio.wait_for(aw, grace)
        except TimeoutError:
            log.warning("worker %s: %s took over %.1f s: given up", self.consumer_id, what, grace)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.close()))

    async def _with_retry(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """Retry a call through Redis outages until it works or the worker is closing."""
        backoff = Backoff()
        while True:
            try:
                return await fn()
            except TRANSIENT_ERRORS as exc:
                raise_if_cancelling()
                delay = backoff.next()
                if self._stopping is not None and self._stopping.is_set() and backoff.failures > 3:
                    raise
                log.warning("worker %s: Redis unavailable (%s); retry in %.2fs", self.consumer_id, exc, delay)
                await asyncio.sleep(delay)

    # ---- supervision ------------------------------------------------------------------
    def _lease_lost(self, lost: dict[bytes, bytes]) -> None:
        """The intake's word that another worker took these in-flight entries over (this one was
        paused or cut off for longer than the lease).  Queued ones are dropped; running ones
        finish, and the intake drops their outcome instead of acking an entry another worker runs."""
        queued = [dl for dl in self._deque if dl.entry_id in lost]
        if queued:
            keep = [dl for dl in self._deque if dl.entry_id not in lost]
            self._deque.clear()  # in place: the slots hold this deque
            self._deque.extend(keep)
            for dl in queued:
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

    # ---- reading ----------------------------------------------------------------------
    async def _unblock_reader(self) -> None:
        intake = getattr(self, "_intake", None)
        if intake is not None:
            await intake.unblock()

    def _capacity(self) -> int:
        """At most ``concurrency + read_count`` entries waiting or running (``concurrency``
        on a queue that uses priorities), plus up to as many again that finished and wait for
        their batched ack, so reading overlaps acking."""
        s = self.settings
        held = len(self._intake.in_flight)
        # no read-ahead on a queue that uses priorities: a job is taken only for a free slot, so
        # one added later with a lower number starts before the ones still waiting
        window = s.concurrency + (0 if self._intake.flow.prioritized else s.read_count)
        room = min(window - (held - self._acking), 2 * window - held)
        if s.max_jobs is not None:  # never take more than the jobs left to run
            room = min(room, s.max_jobs - self.processed - (held - self._acking))
        return room

    async def _reader(self) -> None:
        """Hand the intake's batches to the slots while there is room; everything about reading
        (recovery, the gate, dead-lettering, outages) happens in :meth:`Intake.next_batch`."""
        assert self._stopping is not None
        s, intake = self.settings, self._intake
        busy = False
        idle_since = time.monotonic()
        block = (
            s.read_block_ms if s.idle_exit_secs is None else max(1, min(s.read_block_ms, int(s.idle_exit_secs * 1000)))
        )
        while not self._stopping.is_set():
            self._beat = time.monotonic()
            room = self._capacity()
            if room <= 0:
                await self._wait_for_room()
                continue
            ready = await intake.next_batch(min(room, s.read_count), block)
            if ready:
                busy, idle_since = True, time.monotonic()
                await self._admit(ready)
                await asyncio.sleep(0)  # let the woken slots start before the next read is sized
                continue
            if busy:
                busy = False
                await self._emit(self.core.drained_event(now_ms()))
            if (
                s.idle_exit_secs is not None
                and not self._deque
                and not intake.in_flight
                and time.monotonic() - idle_since >= s.idle_exit_secs
            ):
                log.info("worker %s idle for %.1fs; exiting", self.consumer_id, s.idle_exit_secs)
                self._stopping.set()

    async def _wait_for_room(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._room_waiter = fut
        try:
            await asyncio.wait_for(fut, 0.5)
        except TimeoutError:
            pass
        finally:
            self._room_waiter = None

    async def _admit(self, ready: list[Delivery]) -> None:
        """Send the ``active`` events of the ready jobs (one script call) and hand the jobs to
        the slots at once: the events' round trip overlaps the handlers (awaiting it first cost
        a quarter of the worker's throughput, issue 27).  Whatever writes a job's outcome waits
        for the events in flight first (:meth:`_emitted`), so no ``completed``, ``failed`` or
        ``cancelled`` precedes its ``active``."""
        self._sink.batch(self.name, len(ready))
        call = self.core.active_events_compact(ready, now_ms())
        if call is not None:
            task = asyncio.ensure_future(self._emit(call))  # scheduled before the slots it wakes
            self._emits.add(task)
            task.add_done_callback(self._emits.discard)
        self._deque.extend(ready)
        self._wake(1)
        if len(ready) > 1:
            asyncio.get_running_loop().call_soon(self._top_up)

    def _top_up(self) -> None:
        """Runs once the slot woken for a batch first yields: wakes a slot per job still queued.
        When handlers finish without suspending, that one slot runs the whole batch and the
        others stay parked (waking every idle slot per batch cost ~1 us a job).  A slot sending
        to a pool takes up to ``POOL_RUN`` jobs before it waits: a slot per ``POOL_RUN`` queued."""
        queued = len(self._deque)
        self._wake(queued if self._procs is None or self._tracer is not None else -(-queued // POOL_RUN))

    async def _emitted(self) -> None:
        """Wait for the ``active`` events still in flight (see :meth:`_admit`)."""
        if self._emits:
            await asyncio.wait(tuple(self._emits))

    async def _emit(self, call: Any) -> None:
        """Events are best effort: a failure is logged, never fatal (as in ChasquiMQ)."""
        if call is None:
            return
        try:
            await self.driver.call(call)
        except Exception as exc:  # noqa: BLE001
            log.warning("worker %s: events write failed: %s", self.consumer_id, exc)

    # ---- handler slots ----------------------------------------------------------------
    def _wake(self, n: int) -> None:
        """Wake ``n`` slots for new jobs: first those waiting on their pool calls with room for
        more (one slot keeps many calls out; see ``_settle_pooled``), then parked ones."""
        waiting = self._box_waiting
        while n > 0 and waiting:
            waiting.pop().nudge()
            n -= 1
        while n > 0 and self._idle:
            fut = self._idle.pop()
            if not fut.done():
                fut.set_result(None)
                n -= 1

    def _wake_all(self) -> None:
        self._wake(len(self._idle))

    async def _slot(self) -> None:  # noqa: C901, PLR0915 - the per-job hot path inline: a call per step cost ~10% of the worker's CPU
        """Run queued jobs one after another until the deque is empty, then park.  The success
        path is inline (a coroutine per job for it cost about a tenth of the worker's CPU)."""
        assert self._stopping is not None
        loop = asyncio.get_running_loop()
        queue, stopping, idle, rows = self._deque, self._stopping, self._idle, self._done_rows
        s = self.settings
        store, ack_batch, name = s.store_results, s.ack_batch, self.name
        metrics = None if self._sink is NO_METRICS else self._sink  # the per-job path skips the null sink
        # a _Dispatch is only ever called through ``dispatch.lookup`` below
        handler = cast("Callable[[Job], Any]", self._handler)
        dispatch = handler if isinstance(handler, _Dispatch) else None
        async_fns, fn_timeouts, fn_batches = self._async_fns, self._fn_timeouts, self._fn_batches
        default_timeout = s.job_timeout_ms or 0
        current, cancel_target = self._current, self._cancel_target  # see _watch_cancels
        procs = self._procs
        progress = self._progress
        clock = time.perf_counter_ns
        max_jobs = s.max_jobs
        me = asyncio.current_task()
        tracer = self._tracer
        span = token = None
        lease_check = s.claim_min_idle_ms / 1000 * START_CHECK_FRACTION
        monotonic = time.monotonic
        intake = self._intake
        flow = intake.flow
        # pooled calls go out without waiting (up to POOL_RUN of them), and this slot settles them
        # as the children report: one wake-up for many jobs (tracing keeps a call per slot: its spans)
        box = procs.outcomes() if procs is not None and tracer is None else None
        pooled = self._pooled
        while True:
            debug = log.isEnabledFor(logging.DEBUG)  # once per wake-up, not per job
            while queue:
                if box is not None and box.open >= POOL_RUN:
                    await self._settle_pooled(box)
                    continue
                dl = queue.popleft()
                now = monotonic()
                if now < flow.blocked_until:  # a handler raised RateLimited: start nothing until then
                    flow.requeue(dl)
                    continue
                if now - intake.renewed_at > lease_check and not await intake.lease_held(dl.entry_id, dl.envelope.id):
                    self._room()
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
                    fn = handler if dispatch is None else dispatch.lookup(dl.name)
                    try:
                        is_async = async_fns[fn]
                        own = fn_timeouts.get(fn, 0) if fn_timeouts else 0
                        batch = fn_batches.get(fn, 0) if fn_batches else 0
                    except (KeyError, TypeError):  # TypeError: an unhashable callable, never cached
                        is_async = _is_async(fn)
                        own = handler_timeout(fn)  # a bad chasqui_timeout_ms fails the job, naming it
                        batch = handler_batch(fn)  # ... and a bad chasqui_batch_size
                        with contextlib.suppress(TypeError):
                            async_fns[fn] = is_async
                            if own:
                                fn_timeouts[fn] = own
                            if batch:
                                fn_batches[fn] = batch
                    limit = dl.timeout_ms or own or default_timeout
                    if box is not None and not batch:  # to a child process; a timeout kills it (process_pool.py)
                        fields = (env.id, dl.name, data, env.attempt, env.created_at_ms)
                        call = procs.submit(dl.name if dispatch is not None else None, fields, limit, box)  # type: ignore[union-attr]
                        pooled[call] = (dl, start)
                        continue
                    job = new_job(env.id, dl.name, data, env.attempt, env.created_at_ms, None, progress)
                    if batch:  # a batch handler: this job and up to batch - 1 more of its name, settled each
                        outcome = await self._run_batch(fn, is_async, batch, dl, job, own or default_timeout, start)
                        if span is not None and tracer is not None:
                            tracer.end_consume(span, token, outcome)
                        continue
                    current[me] = dl  # only while suspended in the handler (no other await until cleared)
                    if procs is not None:  # traced: one call at a time, as above
                        result = await procs.run(dl.name if dispatch is not None else None, job, limit)
                    elif limit:
                        result = await self._bounded(fn, job, is_async, limit)
                    else:
                        result = await (fn(job) if is_async else self._call(fn, job))
                    current[me] = None
                    if cancel_target and cancel_target.get(me) is dl:  # the handler swallowed the cancel
                        del cancel_target[me]
                        cast("asyncio.Task[None]", me).uncancel()
                except BaseException as exc:  # every handler failure is routed, none escapes
                    current[me] = None
                    if isinstance(exc, asyncio.CancelledError) and cancel_target.get(me) is dl:
                        del cancel_target[me]  # Queue.cancel: this job ends cancelled, the slot goes on
                        cast("asyncio.Task[None]", me).uncancel()
                        await self._job_cancelled(dl, is_async)
                        if span is not None and tracer is not None:
                            tracer.end_consume(span, token, "cancelled")
                        continue
                    if isinstance(exc, asyncio.CancelledError) and me is not None and me.cancelling():
                        # our own cancellation (the shutdown deadline): the entry stays pending, unrenewed,
                        # and is reclaimed after claim_min_idle_ms.  A handler's own CancelledError is a failure.
                        self._release(dl.entry_id)
                        if span is not None and tracer is not None:
                            tracer.end_consume(span, token, "cancelled")
                        raise
                    if isinstance(exc, RateLimited):
                        await self._rate_limited(dl, exc)
                        if span is not None and tracer is not None:
                            tracer.end_consume(span, token, "rate_limited")
                        continue
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
            if box is not None and box.open:
                await self._settle_pooled(box)
                continue
            if stopping.is_set():
                return
            fut = loop.create_future()
            idle.append(fut)
            await fut

    async def _settle_pooled(self, box: Outcomes) -> None:
        """Wait until one or more of this slot's pool calls end (or, with room for more, new
        jobs come), and settle those that ended.  At the shutdown deadline (this slot cancelled)
        its calls not yet settled are taken back and their entries stay pending: reclaimed after
        the lease, as an in-process job's would be."""
        from .pool_child import NONE_BLOB
        from .process_pool import CallCancelled

        procs, pooled, waiting = self._procs, self._pooled, self._box_waiting
        assert procs is not None
        if box.open < POOL_RUN:
            waiting.append(box)  # new jobs wake this slot too (``_wake``): it has room for them
        try:
            await box.wait()
        except asyncio.CancelledError:
            for call in [c for c in pooled if c.box is box]:
                procs.withdraw(call)
                self._release(pooled.pop(call)[0].entry_id)
            box.take()
            raise
        finally:
            if box in waiting:
                waiting.remove(box)
        now = time.perf_counter_ns()
        done: list[tuple[Delivery, Any, int]] = []
        for call in box.take():
            dl, start = pooled.pop(call)
            outcome = call.outcome
            if outcome is not None and outcome[1] == NONE_BLOB and outcome[0]:  # most handlers return nothing
                done.append((dl, None, (now - start) // 1000))
                continue
            try:
                result = procs.outcome(call)
            except CallCancelled:
                await self._job_cancelled(dl, True)
            except RateLimited as exc:
                await self._rate_limited(dl, exc)
            except Exception as exc:  # noqa: BLE001 - every handler failure is routed, none escapes
                self._failed(dl, exc, (now - start) // 1000)
            else:
                done.append((dl, result, (now - start) // 1000))
        if done:
            self._completed(done)

    async def _rate_limited(self, dl: Delivery, exc: RateLimited) -> None:
        """A handler raised ``RateLimited``: the job goes back without counting an attempt and
        the queue waits (or only its group: the job goes back to its group's list)."""
        if dl.group:
            await self._requeue_grouped(dl, exc.retry_after_ms)
        else:
            self._intake.flow.requeue(dl)
            await self._intake.flow.block(exc.retry_after_ms)

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

    async def _bounded(self, fn: Callable[..., Any], job: Job | list[Job], is_async: bool, limit_ms: int) -> Any:
        """Run ``fn(job)`` for at most ``limit_ms``: an async handler is cancelled at the deadline;
        a plain one in a thread cannot be stopped, so its attempt fails at the deadline, its slot
        is free, and the thread runs on to its end (its result dropped; ``--processes`` kills)."""
        scope = asyncio.timeout(limit_ms / 1000)
        try:
            async with scope:
                return await (fn(job) if is_async else self._call(fn, job))
        except TimeoutError:
            if not scope.expired():
                raise  # the handler's own TimeoutError
            first = job if isinstance(job, Job) else job[0]  # a batch: named by its first job
            if not is_async and not _is_async(fn):
                self._abandon_thread(first.id)
            raise JobTimeout(limit_ms, first.id) from None

    async def _run_batch(
        self, fn: Any, is_async: bool, size: int, first: Delivery, job: Job, default_ms: int, start: int
    ) -> str:
        """One call of a batch handler: ``first`` and up to ``size - 1`` more queued jobs of its
        name, as a list; a list of as many results (or exception instances) back, each job settled
        on its own.  A raised error (or a reply of another shape) fails every job of the call;
        the smallest own timeout of its jobs (else the handler's or worker's) bounds the call.
        Its jobs are not cancellable one by one while the call runs."""
        dls, jobs = [first], [job]
        keep: list[Delivery] = []
        while self._deque and len(dls) < size:
            dl = self._deque.popleft()
            if dl.name != first.name:
                keep.append(dl)
                continue
            try:
                data = dl.payload()
            except CodecError as exc:
                self._undecodable(dl, exc)
                continue
            env = dl.envelope
            dls.append(dl)
            jobs.append(new_job(env.id, dl.name, data, env.attempt, env.created_at_ms, None, self._progress))
        self._deque.extendleft(reversed(keep))  # the others keep their place in line
        own = [dl.timeout_ms for dl in dls if dl.timeout_ms]
        limit = min(own) if own else default_ms
        me = asyncio.current_task()
        try:
            if self._procs is not None:
                key = first.name if isinstance(self._handler, _Dispatch) else None
                results = await self._procs.run(key, jobs, limit)
            else:
                results = await (
                    self._bounded(fn, jobs, is_async, limit)
                    if limit
                    else (fn(jobs) if is_async else self._call(fn, jobs))
                )
            if not isinstance(results, (list, tuple)) or len(results) != len(jobs):
                raise UnrecoverableError(
                    f"batch handler returned {type(results).__name__}"
                    + (f" of {len(results)}" if isinstance(results, (list, tuple)) else "")
                    + f"; expected a list of {len(jobs)} results, one per job"
                )
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError) and me is not None and me.cancelling():
                for dl in dls:  # the shutdown deadline: pending, reclaimed after the lease
                    self._release(dl.entry_id)
                raise
            duration_us = (time.perf_counter_ns() - start) // 1000
            for dl in dls:
                self._failed(dl, exc, duration_us)
            return "failed"
        duration_us = (time.perf_counter_ns() - start) // 1000
        done = []
        for dl, result in zip(dls, results):
            if isinstance(result, BaseException):
                self._failed(dl, result, duration_us)
            else:
                done.append((dl, result, duration_us))
        self._completed(done)
        return "completed"

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
            else:
                encoded = b""
            env = dl.envelope
            rows.append((dl.entry_id, env.id, dl.name, env.attempt + 1, duration_us, encoded))
            self._acking += 1
            if metrics is not None:
                metrics.job_completed(self.name, dl.name, duration_us / 1e6)
            if s.max_jobs is None:
                self.processed += 1
            else:
                self._count_processed()
        if rows and (was_empty or len(rows) >= s.ack_batch):
            self._flush_wanted.set()
        self._room()

    async def _watch_cancels(self) -> None:
        """Every ``CANCEL_POLL_SECS`` while handlers run on a queue with cancel requests: look
        the running jobs up and cancel the slot of each requested one (its handler gets
        ``CancelledError``; a thread runs on).  Costs nothing on a queue never cancelled."""
        flow = self._intake.flow
        while True:
            await asyncio.sleep(CANCEL_POLL_SECS)
            if not self._deque and not self._pooled and not any(self._current.values()):
                continue
            try:
                if not (await flow.cached()).cancels:
                    continue
                running = {task: dl for task, dl in self._current.items() if dl is not None}
                pooled = [(call, dl) for call, (dl, _start) in self._pooled.items() if not call.finished]
                ids = [dl.envelope.id for dl in running.values()] + [dl.envelope.id for dl in self._deque]
                hit = await flow.cancelled_ids(ids + [dl.envelope.id for _call, dl in pooled])
            except TRANSIENT_ERRORS:
                continue  # the reader waits the outage out and logs it
            if not hit:
                continue
            for call, dl in pooled:  # taken back, or its child killed; its slot ends it cancelled
                if dl.envelope.id in hit and self._procs is not None:
                    self._procs.cancel(call)
            for task, dl in running.items():
                if dl.envelope.id in hit and self._current.get(task) is dl and task not in self._cancel_target:
                    self._cancel_target[task] = dl
                    task.cancel()
            queued = [dl for dl in self._deque if dl.envelope.id in hit]  # read ahead, not started
            if queued:
                keep = [dl for dl in self._deque if dl.envelope.id not in hit]
                self._deque.clear()  # in place: the slots hold this deque
                self._deque.extend(keep)
                await self._emitted()  # their `active` events first
                await self._intake.settle_cancelled(queued)
                self._room()

    async def _job_cancelled(self, dl: Delivery, is_async: bool) -> None:
        """A running job was cancelled (``Queue.cancel``): it ends ``cancelled``, never retried."""
        if not is_async and self._procs is None:  # a pool process running it was killed instead
            self._abandon_thread(dl.envelope.id)
        log.info("worker %s: job %s %s cancelled while running", self.consumer_id, dl.envelope.id, dl.name)
        if self._intake.owned([(dl.entry_id,)], 0):
            try:
                await self._emitted()  # its `active` event first
                await self._intake.settle_cancelled([dl])
            except Exception as exc:  # noqa: BLE001 - the entry stays pending: reclaimed, then cancelled
                log.warning("worker %s: job %s could not be ended cancelled: %s", self.consumer_id, dl.envelope.id, exc)
        self._room()
        self._count_processed()

    def _abandon_thread(self, job_id: str) -> None:
        """A plain handler ran past its timeout (or was cancelled) in a pool thread that cannot be
        stopped: later jobs get a fresh pool of the same size, so a stuck thread never takes capacity away (the
        old pool ends with its last thread)."""
        self._abandoned += 1
        old = self._executor
        self._executor = ThreadPoolExecutor(max_workers=self._pool_size, thread_name_prefix=f"chasqui-{self.name}")
        old.shutdown(wait=False)
        log.warning(
            "worker %s: job %s ended (timeout or cancel) in a thread that runs on (%d so far); use an "
            "async handler to stop such jobs",
            self.consumer_id,
            job_id,
            self._abandoned,
        )

    async def _call(self, fn: Callable[..., Any], job: Job | list[Job]) -> Any:
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

    def _release(self, entry_id: bytes) -> None:
        self._intake.release(entry_id)
        self._room()

    def _room(self) -> None:
        """Wake a reader waiting for room (an entry left flight)."""
        waiter = self._room_waiter
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
            await self._emitted()  # a job's `active` event before its outcome
            if self._progress.pending:  # and its last progress report (engine/progress.py)
                await self._progress.flush()
            while self._fail_rows:
                await self._flush_failures()
            while self._done_rows:
                batch = self._done_rows[: s.ack_batch]
                del self._done_rows[: s.ack_batch]  # in place: the slots append to this list
                rows = intake.owned(batch, COMPLETE_ENTRY_ID)
                try:
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
        rows = intake.owned(batch, FAIL_ENTRY_ID)
        if len(rows) < len(batch):
            kept = set(map(id, rows))
            info = [i for row, i in zip(batch, info) if id(row) in kept]
        try:
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
