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
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .. import tracing as _tracing
from ..core.codec import now_ms
from ..core.consumer import (
    ConsumerCore,
    Delivery,
)
from ..core.pacing import Backoff, LogBudget
from ..core.settings import check_flags
from ..core.urls import DEFAULT_URL, client_url
from ..credentials import register as register_credentials
from ..errors import TRANSIENT_ERRORS, ConfigTypeError, ReconnectLimitError
from ..types import Job
from ._clients import raw_client
from ._driver import AsyncDriver
from .cancellation import raise_if_cancelling
from .identity import consumer_name, identity, package_version
from .intake import Intake
from .lease_guard import LeaseGuard
from .metrics import metrics_sink
from .progress import PoolProgress, ProgressReporter
from .promoter import Promoter
from .supervision import Supervisor
from .worker_base import POOL_RUN, _Dispatch, _resolve_handler, log
from .worker_settings import DEFAULT_CONCURRENCY, WorkerSettings, options_to_fields
from .worker_stop import WorkerStop

if TYPE_CHECKING:
    from .process_pool import ProcessPool

__all__ = ["Worker", "WorkerSettings", "Handler", "LogBudget"]

Handler = Callable[[Job], Any]
_IO_MARGIN_SECS = 10.0  # socket timeout beyond the longest expected call (see Worker._run)


class Worker(WorkerStop):
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
        credential_provider: Any = None,
        **options: Any,
    ) -> None:
        self._handler = _resolve_handler(handler)
        if settings is None or concurrency != DEFAULT_CONCURRENCY:
            # chasquimq's signature (default 100, visible to inspect); a given ``settings`` keeps
            # its own concurrency unless this argument is passed with another value
            options["concurrency"] = concurrency
        if settings is not None and not isinstance(settings, WorkerSettings):
            raise ConfigTypeError(f"settings must be a WorkerSettings, got {type(settings).__name__}")
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
                max_result_bytes=self.settings.max_result_bytes if self.settings.store_results else 0,
                label=f"worker of {queue_name!r}",
            )
        redis_url = client_url(redis_url, tls)  # a ConfigError for a bad URL, or TLS on unix://
        register_credentials(redis_url, credential_provider)  # every client of this URL (credentials.py)
        self._url = redis_url
        check_flags(fast_paths=fast_paths, tracing=tracing)
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
            stall_limit=s.max_stalled_attempts if s.stalled_detector_enabled else None,
        )
        self._init_events()  # listeners and the worker's own pause (engine/worker_events.py)
        # OpenTelemetry: a CONSUMER span per attempt when tracing=True (or CHASQUI_OTEL=1) and the
        # API imports; None otherwise, and the slots then never touch it
        self._tracer = _tracing.tracer(tracing)
        self.processed = 0
        self._running = False
        self._closed = False
        self._gave_up: ReconnectLimitError | None = None  # why run() ends in error (reconnect_max_attempts)
        self._stopping: asyncio.Event | None = None
        self._done: asyncio.Event | None = None
        # the max_jobs stop's unblocking task: held so the loop cannot collect it half-way
        self._unblock_task: asyncio.Future[None] | None = None

    # ---- public lifecycle ---------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        return self._running

    @property
    def is_closed(self) -> bool:
        return self._closed

    async def run(self) -> None:
        """Consume until ``close()`` (or a signal, max_jobs, idle_exit); returns after the drain.

        Cancelling the task running it stops the worker as ``close()`` does (running handlers
        get ``shutdown_deadline_secs``), then re-raises ``CancelledError``; a second cancel
        cuts the drain short (the unfinished jobs stay pending and are reclaimed)."""
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
            if self._gave_up is not None:  # reconnect_max_attempts: the drain is over, say why it stopped
                raise self._gave_up
        finally:
            self._running = False
            self._closed = True
            self._done.set()
            self._listeners.emit("closed")
            await self._listeners.settle()

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
        Ns"`` (the reader) or ``"renewal late by Ns"`` (the lease).  ``"left_running"``, only
        while :attr:`left_running` is above 0, says how many handlers run on after their job
        ended without them (``"ok"`` stays as it was: the worker itself works).  While not consuming
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
        left = self.left_running
        if left:
            out["left_running"] = f"{left} handler{'s' if left > 1 else ''} running on after their job ended"
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
            rate_limit=s.rate_limit,
            detect_stalls=s.stalled_detector_enabled,
            on_stalled=self._stalled,
            reconnect_max_attempts=s.reconnect_max_attempts,
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
                await self._procs.start(PoolProgress(self._progress, self))
            except BaseException:
                await self._intake.close()
                await self.driver.close()
                raise
        loop = asyncio.get_running_loop()
        self._listeners.bind(loop)
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
        self._intake.left_running = lambda: self.left_running
        self._guard = LeaseGuard(self._intake, self._url, loop, **timeouts).start()  # leases whole, loop blocked
        background = self._start_background()
        reader = self._tasks.start("reader", self._reader)
        slots = self._slots  # a slot left behind (engine/running_control.py) adds its replacement here
        slots.extend(self._tasks.start("slots", self._slot, f"chasqui-slot-{i}") for i in range(s.concurrency))
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
        """The state of one run, made once Redis answered (what each part holds: ``WorkerBase``)."""
        s = self.settings
        self._deque = collections.deque()
        self._idle = []
        self._tasks = Supervisor(f"worker {self.consumer_id}", self.name, self._sink, self._error)
        self._beat = time.monotonic()  # the reader's last loop iteration (stall detection)
        self._done_rows = []
        self._fail_rows = []
        self._fail_info = []
        self._acking = 0
        self._async_fns = {}
        self._fn_timeouts = {}
        self._fn_batches = {}
        self._current = {}
        self._cancel_target = {}
        self._cancel_sent = {}
        self._timed = {}
        self._left_behind = {}
        self._threads_left = set()
        self._slot_progress = {}
        self._left_reported = 0
        self._slots = []
        self._pooled = {}
        self._box_waiting = []
        self._flush_wanted = asyncio.Event()
        self._final_flush = False
        self._room_waiter = None
        self._emits = set()
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
                backoff.check_limit(self.settings.reconnect_max_attempts, exc)
                log.warning("worker %s: Redis unavailable (%s); retry in %.2fs", self.consumer_id, exc, delay)
                self._error(exc)
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
            if room <= 0 or self._paused:  # Worker.pause() reads nothing (worker_events.py)
                await self._wait_for_room()
                continue
            try:
                ready = await intake.next_batch(min(room, s.read_count), block)
            except ReconnectLimitError as exc:  # reconnect_max_attempts failed reads in a row: stop
                log.error("worker %s: %s; stopping", self.consumer_id, exc)
                self._gave_up = exc
                self._error(exc)
                self._stopping.set()
                return
            if ready:
                busy, idle_since = True, time.monotonic()
                await self._admit(ready)
                await asyncio.sleep(0)  # let the woken slots start before the next read is sized
                continue
            if busy:
                busy = False
                await self._emit(self.core.drained_event(now_ms()))
                if self._listening:
                    self._listeners.emit("drained")
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

    async def _emit(self, call: Any) -> None:
        """Events are best effort: a failure is logged, never fatal (as in ChasquiMQ)."""
        if call is None:
            return
        try:
            await self.driver.call(call)
        except Exception as exc:  # noqa: BLE001
            log.warning("worker %s: events write failed: %s", self.consumer_id, exc)
