"""``EventHub``: one reader of a queue's events stream, shared by every waiter of the process.

``Queue.wait_for_results``/``wait_for_result``, ``Job.wait_for_result`` and
``ChasquiJobTrigger`` wait here.  A waiter used to follow the whole stream itself, so N
waiters decoded every event N times (200 waiters of a busy queue burned a core).  Now one
task per (Redis URL, queue) follows the stream with one blocking connection (client name
``chasqui-events:<queue>``) and wakes only the waiters whose jobs ended; a second, shared
connection of the hub (a lane) reads the stored outcomes.

No wake-up is missed: a waiter registers its ids first, waits until the reader's position
is pinned, and only then reads the stored outcomes; a job that ends later writes its event
after that position.  After a reconnect the reader pins a new position and reads the stored
outcomes of every current waiter again (events of the outage may be gone, trimmed).

The hub starts with its first waiter and closes (both connections) when the last one
leaves.  Hubs are per event loop (an Airflow triggerer runs one loop, so one hub per queue
per triggerer); waiters on other loops or threads get hubs of their own.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Iterable
from typing import Any

from redis import exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..core.calls import Flow, int_reply
from ..core.event_follow import EventCursor
from ..core.event_hub import (
    JobOutcome,
    Outcome,
    Waiter,
    WaiterIndex,
    backfill_call,
    backfill_hits,
    outcome_calls,
    parse_outcomes,
    reader_name,
    settle_hits,
)
from ..core.keys import QueueKeys
from ..core.urls import WAIT_BLOCK_MS, read_timeout, split_cluster_flag
from ..drivers_common import translate_error
from ..errors import ChasquiConnectionError, ChasquiError
from ._clients import CLUSTER, raw_client
from ._driver import AsyncDriver
from .cancellation import raise_if_cancelling, unblock_until_done
from .leader import TRANSIENT

__all__ = ["EventHub", "active_hubs", "event_hub", "wait_for_jobs"]

log = logging.getLogger(__name__)
# The reader must see a lost connection: redis-py's own retry would reconnect and re-send the
# blocked XREAD silently, and the waiters whose events fell in the gap (trimmed, or never written)
# would wait out the read block instead of the stored-outcome re-check a reconnect runs.  Cluster
# clients keep their retries (they re-route on MOVED/ASK through them).
_NO_SILENT_RETRY: dict[str, Any] = {"retry": Retry(NoBackoff(), 0)}

READ_COUNT = 1000
_MAX_BACKOFF_SECS = 5.0
# the reader is a raw redis-py client (a blocking XREAD it can CLIENT UNBLOCK): its errors are
# redis-py's own, so this boundary names them; everything else here goes through the driver
_RECONNECTABLE: tuple[type[BaseException], ...] = (
    *TRANSIENT,
    rexc.ConnectionError,
    rexc.TimeoutError,
    rexc.BusyLoadingError,
    rexc.ReadOnlyError,
)
_READER_ERRORS: tuple[type[BaseException], ...] = (*_RECONNECTABLE, rexc.ResponseError)
# How long a joining waiter tries again when Redis cannot be reached, before it is told so
# (``ChasquiConnectionError``); never longer than the wait's own timeout.
JOIN_GRACE_SECS = 5.0
_JOIN_RETRY_SECS = 0.1

_HUBS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[str, str], EventHub]] = (
    weakref.WeakKeyDictionary()
)


def event_hub(url: str, queue: str) -> EventHub:
    """The running loop's hub of ``(url, queue)``, made on first use."""
    loop = asyncio.get_running_loop()
    hubs = _HUBS.setdefault(loop, {})
    hub = hubs.get((url, queue))
    if hub is None or hub.closing:
        hub = hubs[(url, queue)] = EventHub(url, queue)
    return hub


def active_hubs() -> list[EventHub]:
    """The running loop's open hubs (for tests and tools)."""
    return list(_HUBS.get(asyncio.get_running_loop(), {}).values())


async def wait_for_jobs(
    url: str, queue: str, job_ids: Iterable[str], timeout: float, *, stop_on_failure: bool = False
) -> dict[str, JobOutcome]:
    """``{id: ("completed", result) | ("failed", reason, detail, traceback)}`` once every id ended (or one
    failed, with ``stop_on_failure``); ids still running after ``timeout`` seconds are absent.
    Redis unreachable when the wait starts (for ``JOIN_GRACE_SECS``, or the whole timeout if
    shorter) is ``ChasquiConnectionError``; an outage later only delays wake-ups (the hub
    reconnects and reads the stored outcomes again)."""
    ids = list(dict.fromkeys(job_ids))
    if not ids:
        return {}
    return await event_hub(url, queue).wait(ids, timeout, stop_on_failure=stop_on_failure)


def _joined(keys: QueueKeys, job_ids: list[str]) -> Flow[dict[str, Outcome]]:
    """What a joining waiter learns in one round trip: the stored outcomes of ``job_ids``, and
    for a job without one, an ending event written before the reader's position (see
    ``backfill_call``)."""
    back = backfill_call(keys, job_ids)
    calls = outcome_calls(keys, job_ids)
    raws = yield calls + ([back] if back is not None else [])
    hints = backfill_hits(raws[-1], job_ids) if back is not None else None
    return parse_outcomes(job_ids, raws[: len(calls)], hints)


def _outcomes(
    keys: QueueKeys, job_ids: list[str], hints: dict[str, tuple[str, str]] | None = None
) -> Flow[dict[str, Outcome]]:
    raws = yield outcome_calls(keys, job_ids)
    return parse_outcomes(job_ids, raws, hints)


class EventHub:
    """The shared reader of one queue's events on one server, in one event loop."""

    def __init__(self, url: str, queue: str, *, block_ms: int = WAIT_BLOCK_MS, count: int = READ_COUNT) -> None:
        self.url = url
        self.keys = QueueKeys.for_queue(queue)
        self.client_name = reader_name(self.keys.queue)
        self.cursor = EventCursor(self.keys, count=count, block_ms=block_ms)  # pinned again on each connect
        self.closing = False
        self.reconnects = 0  # connections lost and re-opened while following
        self.reads = 0  # XREAD replies that carried entries
        self._index = WaiterIndex()
        self._task: asyncio.Task[None] | None = None
        self._client: Any = None
        self._reader_id: int | None = None  # the reader connection's CLIENT ID, to unblock it at close
        self._lookup: AsyncDriver | None = None
        self._ready: asyncio.Future[None] | None = None
        self._ever_ready = False

    @property
    def name(self) -> str:
        return self.keys.queue

    @property
    def waiters(self) -> int:
        return len(self._index)

    # ---- waiting -------------------------------------------------------------------------
    async def wait(self, job_ids: list[str], timeout: float, *, stop_on_failure: bool = False) -> dict[str, JobOutcome]:
        """See :func:`wait_for_jobs` (which finds the hub)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        waiter = Waiter(job_ids, stop_on_failure=stop_on_failure)
        woken: asyncio.Future[None] = loop.create_future()
        waiter.wake = woken
        self._index.add(waiter)  # first: an event from now on reaches this waiter
        try:
            await self._join(waiter, loop.time() + min(JOIN_GRACE_SECS, max(timeout, 0.0)))
            if not waiter.done and not woken.done():
                remaining = deadline - loop.time()
                if remaining > 0:
                    await asyncio.wait([woken], timeout=remaining)
            if woken.done() and not woken.cancelled() and woken.exception() is not None:
                raise woken.exception()  # type: ignore[misc]
            return dict(waiter.outcomes)
        finally:
            self._index.remove(waiter)
            if not self._index and not self.closing:
                await self.close()

    async def _join(self, waiter: Waiter, give_up: float) -> None:
        """Wait for the reader's position, then read what ended before it: stored outcomes, else
        recent ending events.  A lost connection is tried again until ``give_up``: one failed
        connect (a reset, a timeout on a loaded host) used to fail every waiter of the hub at once
        though the next attempt, a moment later, succeeded (issue 29).  A cancel the lookup
        swallowed still ends the wait (``cancellation.py``): a cancelled waiter used to stay
        for its whole timeout (issue 29's vanished waiter)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._until_ready()
                if not waiter.done:
                    ids = sorted(waiter.pending)
                    found = await self.lookup.run(_joined(self.keys, ids))
                    raise_if_cancelling()  # the lookup may have swallowed a cancel: never wait on
                    for jid, outcome in found.items():
                        waiter.settle(jid, outcome)
                return
            except ChasquiConnectionError:
                raise_if_cancelling()  # ...or turned it into a lost connection: never try again
                if self.closing or loop.time() >= give_up:
                    raise
                await asyncio.sleep(min(_JOIN_RETRY_SECS, max(0.0, give_up - loop.time())))

    async def _until_ready(self) -> None:
        """Start the reader if needed; wait until its position is pinned (or its connect failed)."""
        if self._ready is None or (self._ready.done() and self._ready.exception() is not None):
            self._ready = asyncio.get_running_loop().create_future()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._follow(), name=f"chasqui-events:{self.name}")
        await asyncio.shield(self._ready)

    @property
    def lookup(self) -> AsyncDriver:
        """The hub's driver for stored outcomes (one lane connection)."""
        if self._lookup is None:
            self._lookup = AsyncDriver(self.url, socket_timeout=read_timeout())
        return self._lookup

    # ---- the reader ----------------------------------------------------------------------
    async def _follow(self) -> None:  # noqa: PLR0915 - the reader's reconnect loop, its states in one place
        failures = 0
        while True:
            try:
                client = self._client
                if client is None:
                    client = self._client = raw_client(
                        self.url,
                        single_connection_client=True,
                        socket_timeout=read_timeout(self.cursor.block_ms or 0),
                        **({} if split_cluster_flag(self.url, None)[1] else _NO_SILENT_RETRY),
                    )
                await self._set_name(client)
                self._reader_id = await self._client_id(client)
                cursor = self.cursor
                cursor.pin(await client.execute_command(*cursor.pin_call().args))
                if self._ever_ready and len(self._index):  # events of the outage may be gone: read the records
                    await self._recheck()
                self._ever_ready = True
                if self._ready is None or self._ready.done():
                    self._ready = asyncio.get_running_loop().create_future()
                self._ready.set_result(None)
                failures = 0
                while not self.closing:
                    rows = await client.execute_command(*cursor.read_call().args)
                    if self.closing:  # redis-py may swallow a cancel that lands as a reply arrives
                        return
                    if not rows:
                        await self._read_nothing()
                        continue
                    self.reads += 1
                    hits = cursor.hits(rows, self._index.by_job)
                    if hits:
                        await self._deliver(hits)
                return  # closing: a cancel lost in the last step must not start another read
            except asyncio.CancelledError:
                raise
            except _READER_ERRORS as exc:
                if self.closing:
                    return
                failures += 1
                self.reconnects += 1
                error = translate_error(exc)  # a raw client: the drivers' boundary, applied here
                if not isinstance(error, ChasquiError):  # an OSError outside redis-py
                    error = ChasquiConnectionError(f"Redis is unreachable: {exc}")
                self._fail_ready(error)
                log.warning("events of %s: Redis unavailable (%s); reconnecting", self.name, exc)
                await self._drop_client()
                await asyncio.sleep(min(0.1 * 2 ** min(failures, 6), _MAX_BACKOFF_SECS))
            except Exception as exc:  # a surprise must not end the reader of every waiter
                if self.closing:
                    return
                failures += 1
                self.reconnects += 1
                self._fail_ready(ChasquiError(f"the events reader of {self.name} failed: {exc!r}"))
                log.exception("events of %s: reader failed; starting again", self.name)
                await self._drop_client()
                await asyncio.sleep(min(0.1 * 2 ** min(failures, 6), _MAX_BACKOFF_SECS))

    async def _set_name(self, client: Any) -> None:
        """CLIENT SETNAME ``chasqui-events:<queue>`` (what CLIENT LIST shows); a user not granted
        it still reads (standalone and Sentinel servers; a cluster reader moves between nodes)."""
        if isinstance(client, CLUSTER):
            return
        try:
            await client.execute_command("CLIENT", "SETNAME", self.client_name)
        except rexc.ResponseError as exc:
            log.debug("events of %s: CLIENT SETNAME refused (%s)", self.name, exc)

    async def _client_id(self, client: Any) -> int | None:
        """The reader's ``CLIENT ID``, so :meth:`close` can end its blocked read at once: redis-py
        does not interrupt a blocked ``XREAD`` on cancel, and the last waiter to leave would
        otherwise wait out the read's block (10 s).  On a cluster the reader answers with a
        handle that ``CLIENT UNBLOCK`` from this process's cluster clients resolves
        (``_clients._RawCluster``): every wait there that had to block returned 10 s late."""
        try:
            return int_reply(await client.execute_command("CLIENT", "ID"))
        except rexc.ResponseError as exc:  # not granted: close() then waits for the block to end
            log.debug("events of %s: CLIENT ID refused (%s)", self.name, exc)
            return None

    async def _deliver(self, hits: dict[str, tuple[str, str]]) -> None:
        ids = list(hits)
        try:
            outcomes = await self.lookup.run(_outcomes(self.keys, ids, hits))
        except ChasquiConnectionError:
            raise
        except ChasquiError as exc:  # a record that cannot be read: its waiters get the error
            self._fail_jobs(ids, exc)
            return
        self._wake(settle_hits(self._index, outcomes))

    async def _read_nothing(self) -> None:
        """A read that brought nothing.  At the largest id (a full events stream) no event can
        come: the stored records may still answer the waiters, and once the stream moved on
        (made again, its last id lowered) the reader reads on."""
        if self.cursor.stuck:
            await self._recheck()
            self.cursor.unstick(await self.lookup.call(self.cursor.end_call()))

    async def _recheck(self) -> None:
        ids = self._index.pending_ids()
        if ids:
            self._wake(settle_hits(self._index, await self.lookup.run(_outcomes(self.keys, ids))))

    @staticmethod
    def _wake(finished: list[Waiter]) -> None:
        for w in finished:
            if not w.wake.done():
                w.wake.set_result(None)

    def _fail_jobs(self, ids: list[str], exc: BaseException) -> None:
        for jid in ids:
            for w in self._index.by_job.get(jid.encode(), ()):
                if not w.wake.done():
                    w.wake.set_exception(exc)

    def _fail_ready(self, exc: BaseException) -> None:
        ready = self._ready
        if ready is not None and not ready.done():
            ready.set_exception(exc)
            ready.exception()  # retrieved here: nobody may be waiting for it

    async def _drop_client(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except Exception as exc:  # noqa: BLE001 - already broken; the next connect tells
                log.debug("events of %s: closing the reader failed: %s", self.name, exc)

    async def _unblock_reader(self) -> bool:
        """End the reader's blocked ``XREAD`` (it returns nil); False when that cannot be done
        (no ``CLIENT ID``, or the call failed): the read then ends at its block."""
        reader_id = self._reader_id
        if reader_id is None:
            return False
        try:
            await self.lookup.client.execute_command("CLIENT", "UNBLOCK", reader_id)
        except Exception as exc:  # noqa: BLE001 - best effort: the read ends at its block anyway
            log.debug("events of %s: CLIENT UNBLOCK failed: %s", self.name, exc)
            return False
        return True

    async def close(self) -> None:
        """Stop the reader and close both connections; later waiters get a new hub."""
        self.closing = True
        hubs = _HUBS.get(asyncio.get_running_loop())
        if hubs is not None and hubs.get((self.url, self.name)) is self:
            del hubs[(self.url, self.name)]
        task, self._task = self._task, None
        if task is not None:
            task.cancel()  # may be lost (a send's wait_for): the read is unblocked until the task ends
            await unblock_until_done(task, self._unblock_reader)
            self._reader_id = None
        self._fail_ready(ChasquiConnectionError("the event hub closed"))
        await self._drop_client()
        lookup, self._lookup = self._lookup, None
        if lookup is not None:
            await lookup.close()
