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
DLQ move, in the same script, so a job is never acked without being re-published).  Their
log is one WARNING per flushed batch, with each job's error at DEBUG.  The embedded
promoter and scheduler are leader-locked loops of their own.

Nothing is acknowledged before its handler finished, so a crash or a lost connection only
ever leaves entries pending; they are reclaimed after ``claim_min_idle_ms``.  ``close()``
stops reading (unblocking the pending read with CLIENT UNBLOCK), lets in-flight and buffered
jobs finish within ``shutdown_deadline_secs`` and flushes the acks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Mapping

import msgpack
from redis import exceptions as rexc

from ..core.calls import int_reply
from ..core.codec import now_ms
from ..core.consumer import ConsumerCore, Delivery, Rejected
from ..core.features import Features
from ..core.retry import RetryPolicy
from ..core.settings import QueueSettings
from ..core.urls import with_tls
from ..errors import ConfigError, UnrecoverableError
from ..types import Job, new_job
from ._driver import AsyncDriver, raw_client
from .leader import TRANSIENT
from .promoter import Promoter

__all__ = ["Worker", "WorkerSettings", "Handler"]

log = logging.getLogger(__name__)
Handler = Callable[[Job], Any]
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_IO_MARGIN_SECS = 10.0  # socket timeout beyond the longest expected call (see Worker._run)
# A cluster failing over answers CLUSTERDOWN / TRYAGAIN / MASTERDOWN for a while: wait it out
# like a lost connection (an ack batch that gave up would strand its entries in _inflight).
_RETRYABLE = TRANSIENT + (rexc.ClusterDownError, rexc.TryAgainError, rexc.MasterDownError)


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """Every worker knob, validated once.  Defaults follow chasquimq's Python ``Worker``."""

    concurrency: int = 100
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
    retry: RetryPolicy = RetryPolicy()
    queue: QueueSettings = QueueSettings()

    def __post_init__(self) -> None:
        for name in ("concurrency", "read_block_ms", "read_count", "claim_min_idle_ms", "ack_batch",
                     "scheduler_tick_ms", "promoter_poll_ms", "result_ttl_ms", "failure_ttl_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 0:
            raise ConfigError(f"max_attempts must be a non-negative int, got {self.max_attempts!r}")
        if self.max_jobs is not None and self.max_jobs <= 0:
            raise ConfigError("max_jobs must be positive")


def _resolve_handler(handler: Any) -> Callable[[Job], Any]:
    """A callable, or a mapping of job name -> callable (unknown names are dead-lettered)."""
    if isinstance(handler, Mapping):
        table = dict(handler)
        for key, fn in table.items():
            if not callable(fn):
                raise ConfigError(f"handler for job name {key!r} is not callable")
        return _Dispatch(table)
    if not callable(handler):
        raise ConfigError(f"handler must be callable or a mapping of job name to callable, got {type(handler).__name__}")
    return handler


class _Dispatch:
    """Dispatch by job name; carries which handlers are coroutine functions."""

    def __init__(self, table: dict[str, Callable[[Job], Any]]) -> None:
        self.table = table

    def lookup(self, name: str) -> Callable[[Job], Any]:
        try:
            return self.table[name]
        except KeyError:
            raise UnrecoverableError(f"no handler registered for job name {name!r}") from None


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


class Worker:
    """Consumes one queue.  Construct anywhere; ``await run()`` does all I/O.  Not thread-safe."""

    def __init__(self, queue_name: str, handler: Any, *, redis_url: str = "redis://127.0.0.1:6379",
                 tls: bool = False, settings: WorkerSettings | None = None, fast_paths: bool | None = None,
                 metrics: Any = None, install_signal_handlers: bool = False,
                 **options: Any) -> None:
        self._handler = _resolve_handler(handler)
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
            queue_name, group=s.group, consumer_id=self.consumer_id, max_attempts=s.max_attempts,
            settings=s.queue, retry=s.retry, events=s.events_enabled,
            result_ttl_ms=s.result_ttl_ms if s.store_results else 0,
            failure_ttl_ms=s.failure_ttl_ms if s.store_results else 0,
        )
        self.processed = 0
        self._running = False
        self._closed = False
        self._stopping: asyncio.Event | None = None
        self._done: asyncio.Event | None = None

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

    async def close(self) -> None:
        """Ask the worker to stop; safe to call repeatedly and before ``run()``."""
        self._closed = True
        if self._stopping is not None and not self._stopping.is_set():
            self._stopping.set()
            await self._unblock_reader()

    async def __aenter__(self) -> "Worker":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ---- orchestration ----------------------------------------------------------------
    async def _run(self) -> None:
        s = self.settings
        # Socket timeouts, so a connection that goes silent (no FIN, no RST) cannot wedge a read
        # or an ack for ever; the longest call is XREADGROUP BLOCK read_block_ms.  A URL's own
        # socket_timeout / socket_connect_timeout win (redis-py lets URL options override).
        timeouts = {"socket_timeout": s.read_block_ms / 1000 + _IO_MARGIN_SECS, "socket_connect_timeout": _IO_MARGIN_SECS}
        self.driver = AsyncDriver(self._url, fast_paths=self._fast_paths, **timeouts)
        self._reader_client = raw_client(self._url, single_connection_client=True, **timeouts)
        self._reader_client_id: int | None = None
        try:
            self._features: Features = await self._with_retry(self.driver.features)
            await self._with_retry(self._ensure_group)
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
        self._done_rows: list[tuple[Any, ...]] = []
        self._fail_rows: list[tuple[Any, ...]] = []  # fail_batch rows, and for the log of each:
        self._fail_info: list[tuple[Any, ...]] = []  # (job_id, name, attempt, exc, outcome, delay)
        self._acking = 0  # entries of _inflight whose handler finished and whose ack is not yet done
        self._async_fns: dict[Any, bool] = {}
        self._flush_wanted = asyncio.Event()
        self._final_flush = False
        self._room_waiter: asyncio.Future[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=s.sync_threads or min(s.concurrency, 64),
                                            thread_name_prefix=f"chasqui-{self.name}")
        loop = asyncio.get_running_loop()
        if self._signals:
            self._install_signals(loop)
        background = self._start_background()
        reader = asyncio.create_task(self._reader(), name="chasqui-reader")
        slots = [asyncio.create_task(self._slot(), name=f"chasqui-slot-{i}") for i in range(s.concurrency)]
        flusher = asyncio.create_task(self._flusher(), name="chasqui-flusher")
        log.info("worker %s consuming %s (concurrency %d, xackdel %s)", self.consumer_id, self.name,
                 s.concurrency, self._features.xackdel)
        try:
            await self._stopping.wait()
        finally:
            await self._shutdown(reader, slots, flusher, background)

    def _start_background(self) -> list[tuple[Any, asyncio.Task[None]]]:
        s = self.settings
        loops: list[Any] = []
        if s.delayed_enabled:
            loops.append(Promoter(self.driver, self.name, holder=self.consumer_id, poll_interval_ms=s.promoter_poll_ms,
                                  settings=s.queue, events=s.events_enabled, metrics=self.metrics))
        if s.run_scheduler:
            from .scheduler import Scheduler  # the scheduler pulls in cron maths only when used

            loops.append(Scheduler(self.driver, self.name, tick_ms=s.scheduler_tick_ms,
                                   settings=s.queue, metrics=self.metrics))
        return [(lp, asyncio.create_task(lp.run(), name=f"chasqui-{lp.role}")) for lp in loops]

    async def _shutdown(self, reader: asyncio.Task[None], slots: list[asyncio.Task[None]],
                        flusher: asyncio.Task[None], background: list[tuple[Any, asyncio.Task[None]]]) -> None:
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
        await asyncio.gather(*(t for _lp, t in background), return_exceptions=True)
        self._executor.shutdown(wait=False, cancel_futures=True)
        await self._reader_client.aclose()
        await self.driver.close()
        log.info("worker %s stopped after %d jobs", self.consumer_id, self.processed)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        import signal

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.close()))

    async def _ensure_group(self) -> None:
        try:
            await self.driver.call(self.core.create_group())
        except Exception as exc:  # BUSYGROUP means it exists; anything else is real
            if "BUSYGROUP" not in str(exc):
                raise

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
        busy = False
        idle_since = time.monotonic()
        failures = 0
        while not self._stopping.is_set():
            try:
                if self._reader_client_id is None:
                    self._reader_client_id = int_reply(await self._reader_client.execute_command("CLIENT", "ID"))
                if time.monotonic() >= next_recovery:
                    next_recovery = time.monotonic() + max(0.05, s.claim_min_idle_ms / 2000)
                    if await self._recover():
                        busy, idle_since = True, time.monotonic()
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
                if "NOGROUP" in str(exc):
                    await self._with_retry(self._ensure_group)
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
                if s.idle_exit_secs is not None and not self._deque and not self._inflight \
                        and time.monotonic() - idle_since >= s.idle_exit_secs:
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
        except asyncio.TimeoutError:
            pass
        finally:
            self._room_waiter = None

    async def _recover(self) -> bool:
        """Claim entries idle longer than ``claim_min_idle_ms`` (crashed or stuck consumers)."""
        s = self.settings
        room = self._capacity()
        if room <= 0:
            return False
        rows = await self.driver.call(self.core.idle_pending(s.claim_min_idle_ms, min(room, s.read_count)))
        counts = {row[0]: int_reply(row[3]) for row in rows or [] if row[0] not in self._inflight}
        if not counts:
            return False
        claimed = await self.driver.call(self.core.claim(s.claim_min_idle_ms, list(counts)))
        batch = [(eid, fields, counts.get(eid, 1) + 1) for eid, fields in claimed or [] if eid is not None]
        if batch:
            log.info("worker %s reclaimed %d idle entries", self.consumer_id, len(batch))
            ready: list[Delivery] = []
            rejected: list[Rejected] = []
            for entry_id, fields, count in batch:
                verdict = self.core.gate(entry_id, fields, count)
                if isinstance(verdict, Rejected):
                    rejected.append(verdict)
                else:
                    ready.append(verdict)
            await self._admit(ready, rejected)
        return bool(batch)

    async def _admit(self, ready: list[Delivery], rejected: list[Rejected]) -> None:
        """Dead-letter what the arrival gate refused, then write the ``active`` events of the
        rest in one script call and hand them to the slots."""
        if rejected:
            await self._reject(rejected)
        if not ready:
            return
        if self.metrics is not None:
            self.metrics.batch(self.name, len(ready))
        await self._emit(self.core.active_events_compact(ready, now_ms()))
        self._inflight.update([dl.entry_id for dl in ready])
        self._deque.extend(ready)
        self._wake(1)
        if len(ready) > 1:
            asyncio.get_running_loop().call_soon(self._top_up)

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
        for r in rejected:
            log.error("worker %s: entry %s of %s dead-lettered: %s %s", self.consumer_id, r.entry_id, self.name,
                      r.reason, r.detail)
        rows = [self.core.reject_row(r) for r in rejected]
        await self._with_retry(lambda: self.driver.call(self.core.fail(rows, self._features, now_ms())))
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
        handler = self._handler
        dispatch = handler if isinstance(handler, _Dispatch) else None
        async_fns = self._async_fns
        clock = time.perf_counter_ns
        max_jobs = s.max_jobs
        while True:
            debug = log.isEnabledFor(logging.DEBUG)  # once per wake-up, not per job
            while queue:
                dl = queue.popleft()
                env = dl.envelope
                job = new_job(env.id, dl.name, dl.data, env.attempt, env.created_at_ms)
                if debug:
                    log.debug("job %s %s attempt %d started", env.id, dl.name, env.attempt + 1)
                start = clock()
                try:
                    fn = handler if dispatch is None else dispatch.lookup(dl.name)
                    try:
                        is_async = async_fns[fn]
                    except (KeyError, TypeError):  # TypeError: an unhashable callable, never cached
                        is_async = _is_async(fn)
                        with contextlib.suppress(TypeError):
                            async_fns[fn] = is_async
                    result = await (fn(job) if is_async else self._call(fn, job))
                    encoded = _packb(result) if store else b""
                except asyncio.CancelledError:
                    self._inflight.discard(dl.entry_id)  # stays pending; reclaimed after claim_min_idle_ms
                    raise
                except BaseException as exc:  # noqa: BLE001 - every handler failure is routed, none escapes
                    self._failed(dl, exc, (clock() - start) // 1000)
                    continue
                duration_us = (clock() - start) // 1000
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

    async def _call(self, fn: Callable[[Job], Any], job: Job) -> Any:
        if _is_async(fn):
            return await fn(job)
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, fn, job)
        if inspect.isawaitable(result):
            result = await result
        return result

    def _failed(self, dl: Delivery, exc: BaseException, duration_us: int) -> None:
        """Buffer a failure for the flusher (like a success row); the entry stays in flight,
        pending in Redis, until the batch that retries or dead-letters it is written."""
        env = dl.envelope
        unrecoverable = isinstance(exc, UnrecoverableError)
        row, outcome, delay = self.core.failure_row(dl, exc, unrecoverable, duration_us, now_ms())
        if log.isEnabledFor(logging.DEBUG):
            log.debug("job %s %s attempt %d failed (%r): %s", env.id, dl.name, env.attempt + 1, exc,
                      outcome if outcome != "retry" else f"retry in {delay} ms")
        self._fail_rows.append(row)
        self._fail_info.append((env.id, dl.name, env.attempt + 1, exc, outcome, delay))
        self._acking += 1
        if len(self._fail_rows) == 1 or len(self._fail_rows) >= self.settings.ack_batch:
            self._flush_wanted.set()
        if self.metrics is not None:
            self.metrics.job_failed(self.name, dl.name)
            if outcome == "retry":
                self.metrics.job_retried(self.name, dl.name)
            else:
                self.metrics.job_dead(self.name, dl.name, outcome)
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
            asyncio.ensure_future(self._unblock_reader())

    # ---- acknowledgements -------------------------------------------------------------
    async def _flusher(self) -> None:
        """Batch acks: up to ``ack_batch`` rows or ``ack_idle_ms`` after the first one."""
        assert self._stopping is not None
        s = self.settings
        while True:
            await self._flush_wanted.wait()
            self._flush_wanted.clear()
            # Wait up to ack_idle_ms for more rows only while handlers are queued or running;
            # with none left, waiting would only delay the acks.
            if len(self._done_rows) < s.ack_batch and len(self._fail_rows) < s.ack_batch and not self._final_flush \
                    and (self._deque or len(self._inflight) > self._acking):
                await asyncio.sleep(s.ack_idle_ms / 1000)
            while self._fail_rows:
                await self._flush_failures()
            while self._done_rows:
                rows = self._done_rows[: s.ack_batch]
                del self._done_rows[: s.ack_batch]  # in place: the slots append to this list
                try:
                    await self._with_retry(
                        lambda rows=rows: self.driver.call(self.core.complete(rows, self._features, now_ms())))
                except Exception as exc:  # noqa: BLE001 - see _unacked
                    self._unacked(len(rows), exc)
                finally:
                    self._acking -= len(rows)
                self._inflight.difference_update([row[0] for row in rows])  # _release() of each row, batched
                self._release(rows[0][0])  # already discarded: this only wakes a reader waiting for room
            if self._final_flush:
                if self._fail_rows or self._done_rows:  # written while the others were
                    self._flush_wanted.set()
                    continue
                return

    def _unacked(self, n: int, exc: BaseException) -> None:
        """A batch that could not be written stays pending in Redis; releasing its entries
        (the caller does) lets recovery reclaim them after ``claim_min_idle_ms`` and re-run
        them (at-least-once), and the flusher lives on for the next batches."""
        log.error("worker %s: %d acks not written (%s); the entries stay pending and will be reclaimed",
                  self.consumer_id, n, exc)

    async def _flush_failures(self) -> None:
        """Write up to ``ack_batch`` buffered failures in one ``fail_batch`` call."""
        n = self.settings.ack_batch
        rows, info = self._fail_rows[:n], self._fail_info[:n]
        del self._fail_rows[:n], self._fail_info[:n]
        try:
            await self._with_retry(lambda: self.driver.call(self.core.fail(rows, self._features, now_ms())))
        except Exception as exc:  # noqa: BLE001 - see _unacked
            self._unacked(len(rows), exc)
        finally:
            self._acking -= len(rows)
        self._inflight.difference_update([row[1] for row in rows])
        self._release(rows[0][1])  # already discarded: this only wakes a reader waiting for room
        retried = sum(1 for row in rows if row[0] == "r")
        job_id, name, attempt, exc, outcome, delay = info[0]
        log.warning("worker %s: %d jobs failed (%d retried, %d dead-lettered); first: job %s %s attempt %d "
                    "failed (%r): %s", self.consumer_id, len(rows), retried, len(rows) - retried, job_id, name,
                    attempt, exc, outcome if outcome != "retry" else f"retry in {delay} ms")


_OPTION_FIELDS = {
    "concurrency", "max_attempts", "group", "consumer_id", "read_block_ms", "read_count", "claim_min_idle_ms",
    "events_enabled", "delayed_enabled", "run_scheduler", "scheduler_tick_ms", "promoter_poll_ms", "store_results",
    "result_ttl_ms", "failure_ttl_ms", "ack_batch", "ack_idle_ms", "shutdown_deadline_secs", "sync_threads",
    "max_jobs", "idle_exit_secs", "retry",
}
_QUEUE_FIELDS = {"max_payload_bytes": "max_payload_bytes", "dlq_max_stream_len": "dlq_max_len",
                 "max_stream_len": "max_stream_len", "events_max_stream_len": "events_max_len"}


def _options_to_fields(options: dict[str, Any]) -> dict[str, Any]:
    """chasquimq's keyword arguments (``None`` = default) onto ``WorkerSettings`` fields."""
    out: dict[str, Any] = {}
    queue: dict[str, Any] = {}
    for key, value in options.items():
        if value is None:
            continue
        if key == "result_ttl":
            out["result_ttl_ms"] = int(value.total_seconds() * 1000) if hasattr(value, "total_seconds") else int(value * 1000)
        elif key in _QUEUE_FIELDS:
            queue[_QUEUE_FIELDS[key]] = value
        elif key in _OPTION_FIELDS:
            out[key] = value
        else:
            raise ConfigError(f"unknown Worker option {key!r}")
    if queue:
        out["queue"] = QueueSettings(**queue)
    return out
