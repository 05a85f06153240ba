"""The scheduler: fires repeatable specs, leader-locked (wire spec 15.2), HA across processes.

Runs embedded in every ``Worker`` (``run_scheduler=True``) and standalone for producer-only
deployments::

    chasqui scheduler --queue emails --promoter        # Redis from $CHASQUI_REDIS_URL or --redis-url
    chasqui scheduler --queue emails --shards 8 --redis-url 'redis://host:7000?cluster=true'
    chasqui promoter --queue emails

The lock ``{chasqui:<q>}:scheduler:lock`` (holder ``s-<uuid>``, TTL 5 s) is renewed every loop,
so a dead leader is replaced within the TTL plus one tick.  Each tick fires up to ``batch``
due specs in two round trips (one read script, then the firing scripts streamed a chunk at a
time; a fire-all backlog adds one per 1,000 windows; see ``core/scheduler.py``); every fire is a
compare-and-set on the spec's score, so even two leaders at once cannot fire a window twice.
"Now" is the server's TIME, read once per tick.  Between chunks the tick yields the event loop
(a chunk is planned while Redis fires the one before), so a big tick never stalls the worker it
is embedded in.  Between ticks the leader sleeps until the earliest next fire, at most
``tick_ms``, so fires are late by milliseconds rather than by up to a tick.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ..core.calls import Flow, Stream
from ..core.keys import QueueKeys
from ..core.scheduler import DEFAULT_BATCH, SchedulerCore, TickResult
from ..core.settings import MAX_MS, QueueSettings, check_int
from ..core.urls import redact_url
from ..errors import ChasquiError
from ._driver import AsyncDriver
from .leader import TRANSIENT, LeaderLoop
from .metrics import metrics_sink

_R = TypeVar("_R")

__all__ = ["Scheduler", "run_standalone", "main"]

log = logging.getLogger(__name__)
LOOP_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT, ChasquiError)


class Scheduler(LeaderLoop):
    role = "scheduler"
    interval_arg = "tick_ms"

    def __init__(
        self,
        driver: AsyncDriver,
        queue: str,
        *,
        holder: str | None = None,
        tick_ms: int = 1000,
        batch: int = DEFAULT_BATCH,
        lock_ttl_secs: int = 5,
        settings: QueueSettings | None = None,
        metrics: Any = None,
        now_fn: Callable[[], int] | None = None,
        min_sleep_ms: int = 5,
    ) -> None:
        """``now_fn`` returns the scheduler's clock in epoch ms (tests inject a fake one); by
        default it is the server's TIME."""
        keys = QueueKeys.for_queue(queue)
        super().__init__(driver, keys.scheduler_lock, holder=holder, interval_ms=tick_ms, lock_ttl_secs=lock_ttl_secs)
        self.keys = keys
        self.core = SchedulerCore(queue, settings, batch=batch)
        self.metrics = metrics_sink(metrics)
        self.now_fn = now_fn
        self.min_sleep = check_int("min_sleep_ms", min_sleep_ms, 0, MAX_MS) / 1000
        self.fired_total = 0
        self.skipped_total = 0
        self.lost_total = 0
        self.quarantined_total = 0
        self.ticks = 0
        self.last: TickResult | None = None

    async def _run(self, flow: Flow[_R]) -> _R:
        """``driver.run`` for the tick's flow, with the event loop yielded between the calls
        of a stream: each chunk is sent as soon as it is planned, then other tasks run before
        the next chunk is planned."""
        step = next(flow)
        while True:
            if isinstance(step, Stream):
                sent: list[asyncio.Future[Any]] = []
                try:
                    for call in step.calls:
                        sent.append(asyncio.ensure_future(self.driver.run_call(call)))
                        await asyncio.sleep(0)
                finally:
                    replies = await asyncio.gather(*sent, return_exceptions=True)
                for reply in replies:
                    if isinstance(reply, BaseException):
                        raise reply
                reply = replies
            else:
                reply = await self.driver.run_call(step)  # type: ignore[arg-type]  # a tick yields no pipelines
            try:
                step = flow.send(reply)
            except StopIteration as stop:
                result: _R = stop.value  # the flow's return value
                return result

    async def tick(self) -> bool | float:
        now = None if self.now_fn is None else self.now_fn()
        started = asyncio.get_running_loop().time()
        try:
            result: TickResult = await self._run(self.core.tick(now))
        except LOOP_ERRORS:
            raise  # the leader loop retries these (with backoff for connection errors)
        except Exception:  # a bug must not end the loop that every schedule depends on
            log.exception("scheduler %s: tick of queue %s failed", self.holder, self.keys.queue)
            return False
        self.last = result
        self.ticks += 1
        self.fired_total += result.fired
        self.skipped_total += result.skipped
        self.lost_total += result.lost
        for key, reason in result.quarantined:
            self.quarantined_total += 1
            log.error(
                "scheduler %s: spec %r of queue %s is corrupt (%s); moved to %s",
                self.holder,
                key,
                self.keys.queue,
                reason,
                self.keys.repeat_quarantine,
            )
        for key in result.dropped:
            log.warning(
                "scheduler %s: spec %r of queue %s had no stored spec; its entry was removed",
                self.holder,
                key,
                self.keys.queue,
            )
        if result.skipped:
            log.info(
                "scheduler %s: %d fires of queue %s skipped past their execution deadline",
                self.holder,
                result.skipped,
                self.keys.queue,
            )
        if result.fired or result.due:
            self.metrics.scheduler_fire(self.keys.queue, result.fired, result.lag_ms or 0)
        if result.full:
            return True
        if result.next_due_ms is None:
            return False
        if self.now_fn is not None:
            current = self.now_fn()
        else:  # the server's clock, moved on by the time this tick took
            current = result.now_ms + int((asyncio.get_running_loop().time() - started) * 1000)
        return max(self.min_sleep, (result.next_due_ms - current) / 1000)


# --------------------------------------------------------------------------- standalone


async def run_standalone(
    queues: Sequence[str],
    redis_url: str,
    *,
    scheduler: bool = True,
    promoter: bool = False,
    tick_ms: int = 1000,
    poll_ms: int = 100,
    settings: QueueSettings | None = None,
    stop: asyncio.Event | None = None,
) -> list[LeaderLoop]:
    """Run a scheduler (and optionally a promoter) for each queue until ``stop`` is set;
    returns the loops (their counters: ``fired_total``, ``promoted_total``)."""
    from .promoter import Promoter  # only the standalone path needs it

    driver = AsyncDriver(redis_url)
    loops: list[LeaderLoop] = []
    for q in queues:
        if scheduler:
            loops.append(Scheduler(driver, q, tick_ms=tick_ms, settings=settings))
        if promoter:
            loops.append(Promoter(driver, q, holder=None, poll_interval_ms=poll_ms, settings=settings))
    stop = stop or asyncio.Event()
    tasks = [asyncio.create_task(lp.run(), name=f"chasqui-{lp.role}") for lp in loops]
    log.info(
        "standalone %s for %d queue(s) on %s",
        "+".join(sorted({lp.role for lp in loops})),
        len(queues),
        redact_url(redis_url),
    )
    try:
        await stop.wait()
    finally:
        for lp in loops:
            lp.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        await driver.close()
    return loops


def main(argv: Sequence[str] | None = None) -> int:
    """Deprecated entry (``python -m``, which prints a runpy warning): ``chasqui scheduler``."""
    from ..ops.standalone import main as standalone_main

    return standalone_main(argv)


if __name__ == "__main__":
    sys.exit(main())
