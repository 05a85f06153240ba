"""A ``Worker``'s slots (``engine/worker.py``): ``concurrency`` coroutines that run the queued
jobs, each under its timeout, in process (async handlers on the loop, plain ones in threads)
or in the process pool (``engine/process_pool.py``), and batch handlers a list at a time.
Cancelling running jobs, and slots left behind by a handler that ignores it:
``engine/running_control.py``; outcomes: ``engine/worker_outcomes.py``."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .. import tracing as _tracing
from ..core.calls import command
from ..core.consumer import UNDECODED, Delivery
from ..core.running import handler_batch, handler_timeout, result_too_large
from ..errors import CodecError, JobTimeout, RateLimited, UnrecoverableError
from ..types import Job, new_job
from .handler_calls import Raised, in_thread
from .intake_leases import START_CHECK_FRACTION
from .metrics import NO_METRICS
from .progress import SlotProgress
from .running_control import LeftBehind, RunningControl
from .worker_base import POOL_RUN, _Dispatch, _is_async, _packb, log

if TYPE_CHECKING:
    from .pool_calls import Outcomes

__all__ = ["SlotRunner"]


class SlotRunner(RunningControl):
    """Runs the queued jobs (see the module docstring)."""

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
        store, ack_batch, name, max_result = s.store_results, s.ack_batch, self.name, s.max_result_bytes
        metrics = None if self._sink is NO_METRICS else self._sink  # the per-job path skips the null sink
        # a _Dispatch is only ever called through ``dispatch.lookup`` below
        handler = cast("Callable[[Job], Any]", self._handler)
        dispatch = handler if isinstance(handler, _Dispatch) else None
        async_fns, fn_timeouts, fn_batches = self._async_fns, self._fn_timeouts, self._fn_batches
        default_timeout = s.job_timeout_ms or 0
        current, cancel_target = self._current, self._cancel_target  # see _watch_cancels
        left = self._left_behind  # see running_control.py: this slot may be left behind in its handler
        procs = self._procs
        clock = time.perf_counter_ns
        max_jobs = s.max_jobs
        me = asyncio.current_task()
        # its jobs' reports, heard by the listeners too (engine/progress.py)
        progress = self._slot_progress[me] = SlotProgress(self._progress, self)
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
            while queue and not self._paused:  # Worker.pause(): the slots park (worker_events.py)
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
                        if self._listening:
                            self._listeners.emit("active", new_job(*fields))
                        call = procs.submit(dl.name if dispatch is not None else None, fields, limit, box)  # type: ignore[union-attr]
                        pooled[call] = (dl, start)
                        continue
                    job = new_job(env.id, dl.name, data, env.attempt, env.created_at_ms, None, progress)
                    if self._listening:
                        self._listeners.emit("active", job)
                    if batch:  # a batch handler: this job and up to batch - 1 more of its name, settled each
                        outcome = await self._run_batch(fn, is_async, batch, dl, job, own or default_timeout, start)
                        if span is not None and tracer is not None:
                            tracer.end_consume(span, token, outcome)
                        continue
                    current[me] = dl  # only while suspended in the handler (no other await until cleared)
                    progress.job = job
                    if procs is not None:  # traced: one call at a time, as above
                        result = await procs.run(dl.name if dispatch is not None else None, job, limit)
                    elif limit:
                        result = await self._bounded(fn, job, is_async, limit, (dl,), start, me)
                    else:
                        result = await (fn(job) if is_async else self._call(fn, job))
                    current[me] = progress.job = None
                    if cancel_target and cancel_target.get(me) is dl:  # the handler swallowed the cancel
                        if me in left:  # ... for so long that its job was ended cancelled without it
                            raise LeftBehind  # (below: the slot ends)
                        del cancel_target[me]
                        cast("asyncio.Task[None]", me).uncancel()
                except BaseException as exc:  # every handler failure is routed, none escapes
                    if left and me in left:  # its job was settled when the slot was left behind
                        outcome = self._forget_slot(me)
                        if span is not None and tracer is not None:
                            tracer.end_consume(span, token, outcome)
                        return
                    current[me] = progress.job = None
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
                        await self._rate_limited(exc, dl)
                        if span is not None and tracer is not None:
                            tracer.end_consume(span, token, "rate_limited")
                        continue
                    outcome = self._failed(dl, exc, (clock() - start) // 1000)
                    if span is not None and tracer is not None:
                        await self._end_failed_span(tracer, span, token, dl, outcome, exc)
                    continue
                if store:
                    err: UnrecoverableError | None
                    try:
                        encoded = _packb(result)
                    except Exception as exc:  # noqa: BLE001 - the handler ran: never run it again for this
                        err = UnrecoverableError(f"handler result cannot be stored: {exc!r}")
                    else:
                        err = result_too_large(len(encoded), max_result) if len(encoded) > max_result else None
                    if err is not None:
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
                if self._listening:
                    self._listeners.emit("completed", job, result)
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

    def _running_job(self, job_id: str) -> Job | None:
        """The Job of ``job_id``'s call running in the pool, or of a batch a slot awaits: the
        argument of the ``progress`` listeners for what a child reports (engine/progress.py)."""
        for call in self._pooled:
            if call.job_id == job_id:
                return new_job(*call.fields)
        for slot in self._slot_progress.values():
            running = slot.job
            for job in running if type(running) is list else (running,):
                if job is not None and job.id == job_id:
                    return cast("Job", job)
        return None

    async def _settle_pooled(self, box: Outcomes) -> None:
        """Wait until one or more of this slot's pool calls end (or, with room for more, new
        jobs come), and settle those that ended.  At the shutdown deadline (this slot cancelled)
        its calls not yet settled are taken back and their entries stay pending: reclaimed after
        the lease, as an in-process job's would be."""
        from .pool_calls import CallCancelled
        from .pool_child import NONE_BLOB

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
                await self._rate_limited(exc, dl)
            except BaseException as exc:  # noqa: BLE001 - every handler failure is routed, none escapes
                # outcome() does not suspend, so no cancellation of this slot arrives inside it: a
                # SystemExit, KeyboardInterrupt or CancelledError here is the handler's, raised in
                # its child, and fails its job as in process (re-raised, it ended the worker)
                self._failed(dl, exc, (now - start) // 1000)
            else:
                done.append((dl, result, (now - start) // 1000))
        if done:
            self._completed(done)

    async def _rate_limited(self, exc: RateLimited, *dls: Delivery) -> None:
        """A handler raised ``RateLimited``: its jobs (one, or a batch's) go back without counting
        an attempt and the queue waits, once (a grouped job: only its group, back in its list)."""
        plain = False
        for dl in dls:
            if dl.group:
                await self._requeue_grouped(dl, exc.retry_after_ms)
            else:
                self._intake.flow.requeue(dl)
                plain = True
        if plain:
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
        except Exception:  # noqa: BLE001 - tracing never decides a job's fate (logged with its traceback)
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

    async def _bounded(
        self,
        fn: Callable[..., Any],
        job: Job | list[Job],
        is_async: bool,
        limit_ms: int,
        dls: tuple[Delivery, ...],
        start: int,
        me: Any,
    ) -> Any:
        """Run ``fn(job)`` for at most ``limit_ms``: an async handler is cancelled at the deadline
        (and, ignoring that for ``LEAVE_BEHIND_MS``, its slot is left behind: ``LeftBehind``
        once it ends); a plain one in a thread cannot be stopped, so its attempt fails at the
        deadline, its slot is free, and the thread runs on to its end (its result dropped;
        ``--processes`` kills)."""
        self._timed[me] = (dls, limit_ms, start)  # what the watchdog needs (running_control.py)
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
        finally:
            self._timed.pop(me, None)  # gone already if it was left behind
            if me in self._left_behind:  # its jobs were failed for their timeout without it
                raise LeftBehind

    async def _run_batch(
        self, fn: Any, is_async: bool, size: int, first: Delivery, job: Job, default_ms: int, start: int
    ) -> str:
        """One call of a batch handler: ``first`` and up to ``size - 1`` more queued jobs of its
        name, as a list; a list of as many results (or exception instances) back, each job settled
        on its own.  A raised error (or a reply of another shape) fails every job of the call;
        the smallest own timeout of its jobs (else the handler's or worker's) bounds the call.
        Its jobs are not cancellable one by one while the call runs."""
        dls, jobs = self._batch_of(first, job, size)
        own = [dl.timeout_ms for dl in dls if dl.timeout_ms]
        limit = min(own) if own else default_ms
        me = asyncio.current_task()
        job._progress.job = jobs  # its jobs report while the call runs (engine/progress.py)
        try:
            if self._procs is not None:
                key = first.name if isinstance(self._handler, _Dispatch) else None
                results = await self._procs.run(key, jobs, limit)
            else:
                results = await (
                    self._bounded(fn, jobs, is_async, limit, tuple(dls), start, me)
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
            job._progress.end()
            if isinstance(exc, LeftBehind):
                raise  # its jobs were settled without it; the slot ends
            if isinstance(exc, asyncio.CancelledError) and me is not None and me.cancelling():
                for dl in dls:  # the shutdown deadline: pending, reclaimed after the lease
                    self._release(dl.entry_id)
                raise
            if isinstance(exc, RateLimited):  # as for one job: every job goes back, no attempt counted
                await self._rate_limited(exc, *dls)
                return "rate_limited"
            duration_us = (time.perf_counter_ns() - start) // 1000
            for dl in dls:
                self._failed(dl, exc, duration_us)
            return "failed"
        job._progress.end()
        duration_us = (time.perf_counter_ns() - start) // 1000
        done = []
        for dl, result in zip(dls, results):
            if isinstance(result, RateLimited):  # that job goes back, as if its own handler raised it
                await self._rate_limited(result, dl)
            elif isinstance(result, BaseException):
                self._failed(dl, result, duration_us)
            else:
                done.append((dl, result, duration_us))
        self._completed(done)
        return "completed"

    def _batch_of(self, first: Delivery, job: Job, size: int) -> tuple[list[Delivery], list[Job]]:
        """``first`` and up to ``size - 1`` more queued jobs of its name (the others keep their
        place in line; an undecodable one is dead-lettered on the way)."""
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
            jobs.append(new_job(env.id, dl.name, data, env.attempt, env.created_at_ms, None, job._progress))
        self._deque.extendleft(reversed(keep))
        return dls, jobs

    async def _call(self, fn: Callable[..., Any], job: Job | list[Job]) -> Any:
        if _is_async(fn):
            return await fn(job)
        if self._tracer is not None:  # the executor thread sees the job's span as current
            call = self._executor.submit(contextvars.copy_context().run, in_thread, fn, job)
        else:
            call = self._executor.submit(in_thread, fn, job)
        try:
            result = await asyncio.wrap_future(call)
        finally:
            if not call.done():  # stopped (deadline, cancel, shutdown) while its thread runs: it runs on
                self._run_on(call)
        if type(result) is Raised:
            # raised here, not thrown in: a StopIteration leaving this coroutine becomes
            # RuntimeError('coroutine raised StopIteration'), as an async handler's does
            raise result.exc
        if inspect.isawaitable(result):
            result = await result
        return result
