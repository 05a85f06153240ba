"""``Queue``: the asyncio producer, a superset of chasquimq's ``Queue``.

Every method validates and encodes through :class:`~..core.enqueue.QueueFlows` and runs the
resulting flow on the asyncio driver; ``sync/queue.py`` is the same shell without ``await``.
Units follow chasquimq: ``delay`` int = ms, float = seconds (or a timedelta/datetime);
``delay_ms`` = ms.  Safe to share between tasks.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from .. import tracing as _tracing
from ..core import controls, groups
from ..core.codec import now_ms
from ..core.enqueue import QueueFlows
from ..core.event_hub import JobOutcome
from ..core.inspect import QueueListing, QueueSnapshot, snapshot
from ..core.inspect import list_queues as list_queues_flow
from ..core.job_details import JobDetails, job_details
from ..core.job_logs import read_logs
from ..core.keys import DEFAULT_GROUP, QueueKeys, check_consumer_name
from ..core.listing import job_counts, job_total, jobs_page, one_job
from ..core.maintenance import DrainReport, ObliterateReport, drain, obliterate
from ..core.removal import clean, remove_report
from ..core.repeat import RepeatableMeta
from ..core.results import check_wait, single_outcome
from ..core.running import cancel as cancel_job
from ..core.running import check_cancel
from ..core.schedules import SpecFlows
from ..core.settings import QueueSettings, check_flags, window_to_ms
from ..core.spec_reads import RepeatableInfo
from ..core.urls import DEFAULT_URL, WAIT_BLOCK_MS, client_url, read_timeout
from ..credentials import register as register_credentials
from ..errors import NotSupportedError
from ..types import Job, JobFailure, new_job
from ._driver import AsyncDriver
from .coalesce import AddCoalescer
from .event_hub import wait_for_jobs

__all__ = ["Queue", "window_to_ms", "list_queues"]


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Queue:
    """Producer for one queue; the connection pool opens lazily on first use."""

    def __init__(
        self,
        name: str,
        *,
        redis_url: str = DEFAULT_URL,
        tls: bool = False,
        max_stream_len: int | None = None,
        max_delay_secs: int | None = None,
        settings: QueueSettings | None = None,
        fast_paths: bool | None = None,
        driver: AsyncDriver | None = None,
        tracing: bool | None = None,
        consumer_group: str = DEFAULT_GROUP,
        credential_provider: Any = None,
    ) -> None:
        self._group = check_consumer_name(consumer_group, "consumer_group")
        settings = QueueSettings.given(settings, max_stream_len=max_stream_len, max_delay_secs=max_delay_secs)
        check_flags(fast_paths=fast_paths, tracing=tracing)
        self._flows = QueueFlows(name, settings)
        self._specs = SpecFlows(name, settings)
        redis_url = client_url(redis_url, tls)  # a ConfigError for a bad URL, or TLS on unix://
        register_credentials(redis_url, credential_provider)  # every client of this URL (credentials.py)
        self._url = redis_url
        self._fast_paths = fast_paths
        self._driver = driver
        self._own_driver = driver is None  # waits go through the process's event hub of this URL
        self._closed = False
        # OpenTelemetry (``tracing``): None unless tracing=True or CHASQUI_OTEL=1 and the API imports
        self._tracer = _tracing.tracer(tracing)
        self._adds = AddCoalescer(lambda: self.driver, self._flows)  # concurrent plain adds share round trips

    @property
    def name(self) -> str:
        return self._flows.keys.queue

    def _group_or(self, group: str | None) -> str:
        """The consumer group a view reads as: the one given, else the queue's ``consumer_group``."""
        return self._group if group is None else group

    @property
    def keys(self) -> QueueKeys:  # for hooks and tools
        return self._flows.keys

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def driver(self) -> AsyncDriver:
        if self._driver is None:
            self._driver = AsyncDriver(
                self._url, fast_paths=self._fast_paths, socket_timeout=read_timeout(WAIT_BLOCK_MS)
            )
        return self._driver

    def _job(self, jid: str, created: int, name: str, data: Any) -> Job:
        return new_job(jid, name, data, 0, created, _queue=self)

    # ---- adding ------------------------------------------------------------------------
    async def add(
        self,
        name: str,
        data: Any,
        *,
        delay: Any = None,
        delay_ms: Any = None,
        attempts: int | None = None,
        backoff: Any = None,
        job_id: str | None = None,
        repeat: Any = None,
        missed_fires: Any = None,
        priority: int | None = None,
        group: str | None = None,
        timeout_ms: Any = None,
        dedup_id: str | None = None,
        dedup_mode: str = "throttle",
        dedup_ttl_ms: Any = None,
    ) -> Job:
        """Enqueue one job (or upsert a repeatable spec when ``repeat`` is given).

        ``priority`` (an int, 1 the most urgent): the job waits beside the stream and enters it
        when the workers have read everything else, lower numbers first, FIFO within one; a job
        without a priority runs before every prioritized one.  Not with ``delay`` or ``job_id``
        (docs/flow-control.md).  ``group`` (a tenant's name, at most 128 bytes): the groups with
        waiting jobs take turns, one job each, under their own limits (``set_group_limits``).
        ``timeout_ms``: each attempt is stopped after that long and fails with reason
        ``timeout`` (docs/running-jobs.md).  ``dedup_id`` with ``dedup_mode`` ``"throttle"``
        (repeats within ``dedup_ttl_ms`` add nothing and return the first job) or
        ``"debounce"`` (the job waits ``dedup_ttl_ms``; a repeat meanwhile replaces it):
        ``core/dedup.py``."""
        if (
            self._tracer is None
            and dedup_id is None
            and delay is None
            and delay_ms is None
            and attempts is None
            and backoff is None
            and job_id is None
            and repeat is None
            and missed_fires is None
            and priority is None
            and group is None
            and timeout_ms is None
        ):  # the plain add: one call, shared with the adds made meanwhile (engine/coalesce.py)
            envelope, name_bytes, jid, created = self._flows.quick_parts(name, data)
            await self._adds.add(envelope, name_bytes)
            return self._job(jid, created, name, data)
        route = self._flows.add_route(
            name,
            data,
            traced=self._tracer is not None,
            delay=delay,
            delay_ms=delay_ms,
            attempts=attempts,
            backoff=backoff,
            job_id=job_id,
            repeat=repeat,
            missed_fires=missed_fires,
            priority=priority,
            group=group,
            timeout_ms=timeout_ms,
            dedup_id=dedup_id,
            dedup_mode=dedup_mode,
            dedup_ttl_ms=dedup_ttl_ms,
        )
        if route.upsert is not None:
            return await self.upsert_repeatable_job(name, data, **route.upsert)
        if route.traced is not None:
            return await self._traced_add(name, data, **route.traced)
        assert route.flow is not None
        jid, created = await self.driver.run(route.flow)
        return self._job(jid, created, name, data)

    async def _traced_add(self, name: str, data: Any, **options: Any) -> Job:
        """``add`` inside a PRODUCER span whose traceparent rides in the entry (immediate adds)."""
        tracer = self._tracer
        assert tracer is not None
        with tracer.produce(self.name, name) as span:
            flow = self._flows.enqueue(name, data, trace=tracer.traceparent(), **options)
            jid, created = await self.driver.run(flow)
            span.set_attribute("messaging.message.id", jid)
            if options["delay"] is not None or options["delay_ms"] is not None:
                span.set_attribute("chasqui.trace_carried", False)  # a delayed member has no room for it
            return self._job(jid, created, name, data)

    async def add_unique(
        self,
        name: str,
        data: Any,
        *,
        job_id: str | None = None,
        key: str | None = None,
        window: timedelta | float = timedelta(hours=1),
        delay: Any = None,
        delay_ms: Any = None,
        attempts: int | None = None,
        backoff: Any = None,
        timeout_ms: Any = None,
    ) -> Job:
        """Add unless the same unique key was added within ``window``; then return the first job.

        The key is ``key``, else ``job_id``, else a hash of name and data.  Atomic on
        Redis 7 (a marker under the queue's hash tag), across processes.
        """
        options = {
            "job_id": job_id,
            "key": key,
            "window_ms": window_to_ms(window),
            "delay": delay,
            "delay_ms": delay_ms,
            "attempts": attempts,
            "backoff": backoff,
            "timeout_ms": timeout_ms,
        }
        if self._tracer is not None:
            with self._tracer.produce(self.name, name) as span:
                flow = self._flows.enqueue_unique(name, data, trace=self._tracer.traceparent(), **options)
                jid, created = await self.driver.run(flow)
                span.set_attribute("messaging.message.id", jid)
                return self._job(jid, created, name, data)
        jid, created = await self.driver.run(self._flows.enqueue_unique(name, data, **options))
        return self._job(jid, created, name, data)

    async def add_bulk(self, jobs: Sequence[Mapping[str, Any]]) -> list[Job]:
        """Enqueue many jobs in one round trip: every item is validated and encoded before
        anything is sent, then script calls of 250 jobs stream out as their ids and envelopes
        are made (of 1,000 when items carry options)."""
        return await self.driver.run(self._flows.enqueue_bulk(jobs, self._job))

    async def cancel(self, job_id: str, *, group: str | None = None) -> str:
        """Cancel job ``job_id``: a delayed one is removed now and ends ``"cancelled"``; a
        waiting or running one ends ``"cancelled"`` when a worker meets it (a running async
        handler gets ``CancelledError`` within ``CANCEL_POLL_SECS``).  Never retried, never
        dead-lettered; its waiters see it fail with reason ``cancelled``.  Returns
        ``"cancelled"``, ``"requested"`` (a worker will end it), or the state it had already
        ended in (``"completed"``, ``"failed"``, ``"cancelled"``).  docs/running-jobs.md."""
        group = self._group_or(group)
        check_cancel(job_id, group)
        xackdel = (await self.driver.features()).xackdel
        events_max = self._flows.settings.events_max_len
        return await self.driver.run(cancel_job(self.keys, job_id, group=group, xackdel=xackdel, events_max=events_max))

    async def cancel_delayed(self, job_id: str) -> bool:
        return await self.driver.run(self._flows.cancel_delayed(job_id))

    # ---- repeatable specs (cron / every) -------------------------------------------------
    async def upsert_repeatable_job(
        self,
        name: str,
        data: Any,
        *,
        repeat: Any,
        key: str | None = None,
        limit: int | None = None,
        start_after: Any = None,
        end_before: Any = None,
        missed_fires: Any = None,
        attempts: int | None = None,
        backoff: Any = None,
        deadline: Any = None,
        while_paused: str | None = None,
        job_id: str | None = None,
        start_after_ms: int | None = None,
        end_before_ms: int | None = None,
        timeout_ms: Any = None,
        priority: int | None = None,
        group: str | None = None,
        dedup_id: str | None = None,
        dedup_mode: str = "throttle",
        dedup_ttl_ms: Any = None,
    ) -> Job:
        """Create or replace a repeatable spec; the returned Job's ``id`` is the spec key.

        ``repeat``: ``RepeatPattern.cron(expr, tz=...)`` or ``RepeatPattern.every(ms)`` (or the
        chasquimq classes, or their dict forms).  ``key`` defaults to ``<name>::cron:<expr>:<tz>``
        / ``<name>::every:<ms>``.  ``start_after``/``end_before``: datetime (naive = UTC) or
        epoch ms (``*_ms``: chasquimq's names).  ``missed_fires``: skip (default), fire-once or
        fire-all(n).  ``attempts``/``backoff``: retry override of every fire; ``deadline``
        (timedelta or ms): a fire later than that past its scheduled time is skipped and
        counted.  ``while_paused``: "queue" (default: fires due while the queue is paused run
        after the resume) or "skip" (they are skipped and counted).  ``job_id`` names the spec
        like ``key`` (chasquimq drops it).  ``timeout_ms``: every fire's own timeout (each
        attempt is stopped after that long; docs/running-jobs.md).  ``priority`` or ``group``:
        every fire waits beside the stream as a job added with it (docs/flow-control.md).
        ``dedup_id`` / ``dedup_mode`` / ``dedup_ttl_ms``: every fire is added as ``add`` adds
        a job with them, sharing the id's marker with every other producer (docs/running-jobs.md).  Re-upserting a key
        replaces the spec and its timeline (the old next fire never fires) and resumes it if
        paused.  Invalid cron, unknown zone, interval <= 0, end before start or no future fire
        raise ConfigError.
        """
        flow = self._specs.upsert(
            name,
            data,
            repeat=repeat,
            key=key,
            limit=limit,
            start_after=start_after,
            end_before=end_before,
            missed_fires=missed_fires,
            attempts=attempts,
            backoff=backoff,
            deadline=deadline,
            while_paused=while_paused,
            job_id=job_id,
            start_after_ms=start_after_ms,
            end_before_ms=end_before_ms,
            timeout_ms=timeout_ms,
            priority=priority,
            group=group,
            dedup_id=dedup_id,
            dedup_mode=dedup_mode,
            dedup_ttl_ms=dedup_ttl_ms,
        )
        spec_key, created = await self.driver.run(flow)
        return self._job(spec_key, created, name, data)

    async def upsert_repeatable_bulk(self, specs: Sequence[Mapping[str, Any]]) -> list[str]:
        """Upsert many specs (dicts with ``upsert_repeatable_job``'s argument names plus ``name``
        and ``data``); returns their keys.  One script call per 1,000 specs, streamed: each
        chunk is validated and encoded while Redis writes the previous one, and a bad item
        fails the call before its chunk is sent (earlier chunks stay written)."""
        keys, _created = await self.driver.run(self._specs.upsert_bulk(specs))
        return keys

    async def get_repeatable_job(self, key: str) -> RepeatableInfo | None:
        """One spec, active or paused, with its counters and overrides; None if absent."""
        return await self.driver.run(self._specs.get(key))

    async def get_repeatable_jobs(self, limit: int = 100) -> list[RepeatableMeta]:
        """chasquimq's listing: the first ``limit`` active specs by next fire (no payload)."""
        return await self.driver.run(self._specs.list_meta(limit))

    async def list_repeatable(
        self, cursor: str | None = None, count: int = 100
    ) -> tuple[list[RepeatableInfo], str | None]:
        """One page of all specs (active, then paused) and the cursor of the next (None at the end)."""
        return await self.driver.run(self._specs.list_page(cursor, count))

    async def remove_repeatable_by_key(self, key: str) -> bool:
        return await self.driver.run(self._specs.remove(key))

    async def pause_repeatable(self, key: str) -> bool:
        """Stop a spec firing (no scheduler, ChasquiMQ's included, sees it); False if absent."""
        return await self.driver.run(self._specs.pause(key))

    async def resume_repeatable(self, key: str) -> bool:
        """Fire again from the next future instant (windows passed while paused are not fired)."""
        return await self.driver.run(self._specs.resume(key))

    async def trigger_repeatable(self, key: str) -> Job | None:
        """Fire one job from the spec now, leaving its schedule and counters alone."""
        fired = await self.driver.run(self._specs.trigger(key))
        if fired is None:
            return None
        jid, name, data = fired
        return self._job(jid, now_ms(), name, data)

    async def get_quarantined(self) -> dict[str, bytes]:
        """Stored specs the scheduler could not decode, moved aside: ``{key: raw bytes}``."""
        return await self.driver.run(self._specs.quarantined())

    # ---- dead letters ------------------------------------------------------------------
    async def peek_dlq(self, limit: int = 20) -> list[dict[str, Any]]:
        return await self.driver.run(self._flows.peek_dlq(limit))

    async def replay_dlq(self, limit: int = 100) -> int:
        return await self.driver.run(self._flows.replay_dlq(limit))

    async def replay_dlq_report(self, limit: int = 100) -> dict[str, int]:
        """``replay_dlq`` that pages past undecodable entries: ``{"replayed": n, "skipped": k}``."""
        return await self.driver.run(self._flows.replay_dlq_report(limit))

    async def remove_dlq(self, dlq_ids: Sequence[str]) -> int:
        """Delete DLQ entries by id (``peek_dlq``'s ``dlq_id``); the number that existed."""
        return await self.driver.run(self._flows.remove_dlq(dlq_ids))

    async def purge_dlq(self, *, reason: str | None = None, name: str | None = None) -> int:
        """Delete the DLQ's entries (all, or those with this reason and/or job name); the count."""
        return await self.driver.run(self._flows.purge_dlq(reason=reason, name=name))

    # ---- results (workers started with store_results=True) -------------------------------
    async def get_job_result(self, job_id: str) -> Any:
        return await self.driver.run(self._flows.get_result(job_id))

    async def get_job_result_bulk(self, job_ids: Sequence[str]) -> list[Any]:
        return await self.driver.run(self._flows.get_results(job_ids))

    async def get_failure(self, job_id: str) -> JobFailure | None:
        """The failure record of a dead-lettered job (reason, error, ``traceback``), or None."""
        return await self.driver.run(self._flows.get_failure(job_id))

    async def get_job_state(self, job_id: str) -> str:
        """``completed``, ``failed`` (in the DLQ), ``cancelled``, ``delayed``, ``active`` (a worker
        runs it), ``waiting``, or ``unknown`` (no trace: a wrong id, or its records expired).
        Ended jobs and caller-id delayed ones are a few key lookups; the others are found as
        :meth:`get_job_details` finds them (a bounded search of the delayed set and the stream)."""
        return await self.driver.run(self._flows.get_job_state(job_id, group=self._group))

    async def wait_for_results(
        self, job_ids: Sequence[str], timeout: float = 30.0, *, stop_on_failure: bool = False
    ) -> dict[str, JobOutcome]:
        """Block until the jobs end (or one failed, with ``stop_on_failure``).

        Waits through the process's shared reader of this queue's events (``event_hub.py``:
        one connection per queue however many waiters); a Queue made with its own ``driver=``
        follows the stream on that driver instead.
        """
        ids, ms = check_wait(job_ids, timeout, stop_on_failure)
        if self._own_driver:
            outcomes = await wait_for_jobs(self._url, self.name, ids, ms / 1000, stop_on_failure=stop_on_failure)
            return await self.driver.run(self._flows.with_handler_errors(outcomes))
        flow = self._flows.wait_for_jobs(ids, ms, _monotonic_ms, stop_on_failure=stop_on_failure)
        return await self.driver.run(flow)

    async def wait_for_result(self, job_id: str, timeout: float = 30.0) -> Any:
        """The handler's return value; ``JobFailed`` if it was dead-lettered, ``TimeoutError`` at the deadline."""
        return single_outcome(job_id, await self.wait_for_results([job_id], timeout), timeout)

    async def inspect(self, *, group: str | None = None) -> QueueSnapshot:
        """The queue as every viewer reads it (``core/inspect.snapshot``): counts, consumers,
        the workers that beat and how many are alive (``live_consumers``), the controls."""
        return await self.driver.run(snapshot(self.name, group=self._group_or(group), now_ms=now_ms()))

    async def get_job_details(self, job_id: str, *, group: str | None = None, events_window: int = 1000) -> JobDetails:
        """What is known of one job: its state (completed, failed, active, waiting, delayed or
        unknown), name, data, attempts, result or failure record, DLQ entry and events (the
        newest ``events_window`` of the queue's, filtered).  Every search is bounded; ``notes``
        says where a bound may have hidden something.  ``JobNotFound`` when nothing at all is
        known of the id (``unknown``: only events are left, and they do not say)."""
        return await self.driver.run(
            job_details(self.name, job_id, group=self._group_or(group), events_window=events_window)
        )

    # ---- chasquimq's introspection (core/listing.py: the read model's counts and pages) ----
    async def get_job_counts(self, *types: str) -> dict[str, int]:
        """``{state: count}`` for ``waiting``, ``active``, ``delayed``, ``completed``,
        ``failed`` and ``paused`` (1 or 0), or only the types named, in that order; an unknown
        type is a ``ValueError``.  What each counts: ``core/listing.py`` (``completed``: over the
        last 8 days, as the workers' heartbeats report them)."""
        return await self.driver.run(job_counts(self.name, group=self._group, types=types, now_ms=now_ms()))

    async def count(self) -> int:
        """The jobs not ended yet: waiting + active + delayed."""
        return job_total(await self.get_job_counts("waiting", "active", "delayed"))

    async def get_waiting_count(self) -> int:
        return (await self.get_job_counts("waiting"))["waiting"]

    async def get_active_count(self) -> int:
        return (await self.get_job_counts("active"))["active"]

    async def get_delayed_count(self) -> int:
        return (await self.get_job_counts("delayed"))["delayed"]

    async def get_failed_count(self) -> int:
        return (await self.get_job_counts("failed"))["failed"]

    async def get_completed_count(self) -> int:
        return (await self.get_job_counts("completed"))["completed"]

    async def get_jobs(self, state: str, offset: int = 0, limit: int = 100) -> list[Job]:
        """Up to ``limit`` jobs in ``state`` (``waiting``, ``active``, ``delayed``,
        ``completed`` or ``failed``) after the first ``offset``, in the order each state keeps
        (``core/listing.py``); ``ValueError`` for another state, a negative offset, or a limit
        outside 1 to 10,000."""
        rows = await self.driver.run(jobs_page(self.name, state, group=self._group, offset=offset, limit=limit))
        return [new_job(*row[:5], _queue=self, progress=row[5], stalled_count=row[6]) for row in rows]

    async def get_job_logs(self, job_id: str, start: int = 0, end: int = -1, asc: bool = True) -> tuple[list[str], int]:
        """``(lines, how many the job has)`` of the lines its handlers logged (``job.log``):
        ``start`` to ``end`` inclusive, from the oldest (``asc``) or the newest, negative from
        the other end, clamped to what exists (``core/job_logs.py``)."""
        return await self.driver.run(read_logs(self.name, job_id, start, end, asc))

    async def get_job(self, job_id: str) -> Job | None:
        """The job (name, data and attempt count as stored; a completed job's data is None),
        found as :meth:`get_job_details` finds it; None when nothing is known of the id."""
        row = await self.driver.run(one_job(self.name, job_id, group=self._group))
        return None if row is None else new_job(*row[:5], _queue=self, progress=row[5], stalled_count=row[6])

    # ---- flow control (core/controls.py) ---------------------------------------------------
    async def pause(self) -> None:
        """No worker starts a new job of this queue until :meth:`resume` (running jobs finish;
        producers, the promoter and the scheduler go on)."""
        await self.driver.run(controls.pause(self.keys))

    async def resume(self) -> None:
        """Workers start jobs of this queue again."""
        await self.driver.run(controls.resume(self.keys))

    async def is_paused(self) -> bool:
        return (await self.driver.run(controls.read_controls(self.keys))).paused

    async def set_rate_limit(self, max_jobs: int, per_ms: int) -> None:
        """All workers together start at most ``max_jobs`` jobs of this queue per fixed window
        of ``per_ms`` milliseconds (on the server's clock); the others wait, no attempt spent.
        ``ConfigError`` unless both are positive ints (``max_jobs`` up to 10**9, ``per_ms`` up
        to a year)."""
        await self.driver.run(controls.set_rate_limit(self.keys, max_jobs, per_ms))

    async def get_rate_limit(self) -> controls.RateLimit | None:
        """The rate limit the workers obey (None: none, or a value they cannot read)."""
        return (await self.driver.run(controls.read_controls(self.keys))).rate

    async def clear_rate_limit(self) -> None:
        await self.driver.run(controls.clear_rate_limit(self.keys))

    async def set_concurrency(self, n: int | None) -> None:
        """At most ``n`` jobs of this queue run at once over all workers (None: no limit).  A
        slot held by a worker that died comes back one lease after its last renewal.
        ``ConfigError`` unless ``n`` is an int from 1 to 10**6."""
        if n is None:
            await self.clear_concurrency()
            return
        await self.driver.run(controls.set_concurrency(self.keys, n))

    async def get_concurrency(self) -> int | None:
        """The concurrency limit the workers obey (None: none, or a value they cannot read)."""
        return (await self.driver.run(controls.read_controls(self.keys))).concurrency

    async def clear_concurrency(self) -> None:
        await self.driver.run(controls.clear_concurrency(self.keys))

    async def set_group_limits(
        self,
        concurrency: int | None = None,
        max_jobs: int | None = None,
        per_ms: int | None = None,
        group: str | None = None,
    ) -> None:
        """Limits of one job group (``group``), or the default of every group without its own
        (None): at most ``concurrency`` of its jobs running at once, at most ``max_jobs``
        started per ``per_ms`` (together).  A limit given as None is removed."""
        await self.driver.run(groups.set_group_limits(self.keys, concurrency, max_jobs, per_ms, group))

    async def get_group_limits(self, group: str | None = None) -> groups.GroupLimits:
        """The limits ``group`` obeys (its own, else the default), as the workers read them."""
        return await self.driver.run(groups.get_group_limits(self.keys, group))

    async def clear_group_limits(self, group: str | None = None) -> None:
        await self.driver.run(groups.clear_group_limits(self.keys, group))

    # ---- emptying (BullMQ's drain and obliterate) -----------------------------------------
    async def drain(self, *, delayed: bool = True) -> DrainReport:
        """Delete the waiting jobs and, with ``delayed``, the delayed ones; running jobs stay.

        A job a worker has read (a pending entry) is never deleted: its worker finishes it, or
        another reclaims it after the lease, and a retry it needs goes to the delayed set as
        usual.  Jobs added after the drain began are kept; the DLQ, results and repeatable specs
        are left alone (a spec keeps firing).  Safe beside running producers and workers."""
        return await self.driver.run(drain(self.name, delayed=delayed))

    async def obliterate(self, *, force: bool = False) -> ObliterateReport:
        """Delete every key of the queue: jobs, DLQ, events, results, failure records, specs.

        Refuses (``QueueInUse``, nothing deleted) while a worker uses the queue: a pending
        entry, a consumer that read in the last minute, or a promoter or scheduler lock held;
        ``force=True`` deletes anyway (running jobs' acks then find nothing).  Stop producers
        first: a job added while it runs may be deleted or may survive."""
        sweep = not hasattr(self.driver.client, "nodes_manager")  # no routable SCAN on a cluster
        return await self.driver.run(obliterate(self.name, force=force, sweep=sweep))

    # ---- chasquimq's job maintenance (core/removal.py) ----------------------------------
    async def remove(self, job_id: str) -> int:
        """Delete what is left of a job that is not running (a worker's job stays: ``cancel``
        ends it): how many of its delayed, waiting, DLQ and stored-result places held it."""
        return sum((await self.remove_report(job_id)).values())

    async def remove_report(self, job_id: str) -> dict[str, bool]:
        """``remove``, saying where the job was found: ``{"delayed", "stream", "dlq", "result"}``
        (``stream``: waiting in the stream or the prioritized set; ``result``: a stored result
        or failure record)."""
        return await self.driver.run(remove_report(self.name, job_id, now_ms=now_ms()))

    async def clean(self, grace_ms: int, limit: int, state: str = "completed") -> list[str]:
        """Delete up to ``limit`` jobs (0: no limit) in ``state`` (``waiting``, ``delayed``,
        ``failed`` or ``completed``: stored results) older than ``grace_ms``, with their records;
        their ids, in the state's order (oldest first; delayed: soonest due first).  How age is
        counted in each state: ``core/removal.py``.  A running job is never deleted."""
        return await self.driver.run(clean(self.name, grace_ms, limit, state, now_ms=now_ms()))

    # ---- lifecycle ---------------------------------------------------------------------
    async def close(self) -> None:
        if self._driver is not None:
            await self._driver.close()
            self._driver = None
        self._closed = True

    async def __aenter__(self) -> Queue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def list_queues(
    target: str | AsyncDriver = DEFAULT_URL,
    *,
    match: str = "*",
    limit: int = 1000,
    cursor: str = "0",
    max_scan_calls: int = 100,
) -> QueueListing:
    """Every queue on the server whose name matches the glob ``match``, with its counts
    (``chasqui queues``; dashboards): a cursor SCAN capped at ``max_scan_calls`` calls of 1,000
    keys and ``limit`` queues, ``truncated`` when a cap stopped it.  ``target``: a URL or a
    driver (kept open).  Not on Redis Cluster, where no SCAN reaches every node in one cursor."""
    driver = AsyncDriver(target) if isinstance(target, str) else target
    try:
        if hasattr(driver.client, "nodes_manager"):
            raise NotSupportedError("listing queues needs one server: on Redis Cluster, inspect queues by name")
        return await driver.run(
            list_queues_flow(match=match, limit=limit, cursor=cursor, max_scan_calls=max_scan_calls)
        )
    finally:
        if isinstance(target, str):
            await driver.close()
