"""Supervised tasks: a loop that crashes is logged with its traceback and started again after
a backoff, and its record (restarts, last error, backing off) is what a health check reports.

The worker runs every loop of its own (reader, slots, flusher, lease, promoter, scheduler)
under one :class:`Supervisor`; every loop re-reads its state when it starts, so a restart is safe.
"""

from __future__ import annotations

import asyncio
import io
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..core.pacing import Backoff
from .metrics import NO_METRICS, WorkerMetrics

__all__ = ["STOP_GRACE_SECS", "Supervisor", "TaskHealth", "settle_tasks"]

log = logging.getLogger(__name__)
CALM_SECS = 60.0  # a crash this long after the previous one starts the backoff over
STOP_GRACE_SECS = 10.0  # how long a stop waits for a cancelled or stopped task before going on


@dataclass(slots=True)
class TaskHealth:
    """One supervised role's record (a role can be many tasks: the slots)."""

    restarts: int = 0
    last_error: str = ""
    failed_at: float = 0.0
    backing_off: int = 0  # tasks of this role waiting to restart
    done: int = 0  # tasks of this role that returned


class Supervisor:
    """Starts tasks by role; ``metrics`` hears ``task_restarted(queue, role, n)`` (n 0 when a
    role first starts, so the series exists before a first crash)."""

    def __init__(
        self,
        label: str,
        queue: str,
        metrics: WorkerMetrics = NO_METRICS,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.label = label
        self.queue = queue
        self.metrics = metrics
        self.on_error = on_error  # hears each failure before the restart (a worker's "error" listeners)
        self.roles: dict[str, TaskHealth] = {}

    def start(self, role: str, fn: Callable[[], Awaitable[None]], name: str | None = None) -> asyncio.Task[None]:
        if role not in self.roles:
            self.metrics.task_restarted(self.queue, role, 0)
        self.roles.setdefault(role, TaskHealth())
        return asyncio.create_task(self._run(role, fn), name=name or f"chasqui-{role}")

    async def _run(self, role: str, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` until it returns; an unexpected exception is logged in full and ``fn``
        restarted after a backoff (0.1 s doubling to 5 s; reset after ``CALM_SECS`` without a crash)."""
        h = self.roles[role]
        backoff = Backoff()
        while True:
            try:
                await fn()
                h.done += 1
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():  # a cancel that surfaced as another error
                    raise asyncio.CancelledError from exc
                now = time.monotonic()
                if now - h.failed_at >= CALM_SECS:
                    backoff.reset()
                delay = backoff.next()
                h.restarts += 1
                h.failed_at = now
                self.metrics.task_restarted(self.queue, role, 1)
                h.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.error("%s: %s task failed; restarting in %.2fs", self.label, role, delay, exc_info=True)
                if self.on_error is not None:
                    self.on_error(exc)
                h.backing_off += 1
                try:
                    await asyncio.sleep(delay)
                finally:
                    h.backing_off -= 1

    def report(self) -> dict[str, Any]:
        """``{"ok": no role waiting to restart, role: True | "restarting: ..." | "restarted N times; ..."}``."""
        out: dict[str, Any] = {"ok": True}
        for role, h in self.roles.items():
            if h.backing_off:
                out[role] = f"restarting: {h.last_error}"
                out["ok"] = False
            elif h.restarts:
                out[role] = f"restarted {h.restarts} times; last error: {h.last_error}"
            else:
                out[role] = True
        return out


async def settle_tasks(
    tasks: list[asyncio.Task[None]], label: str, *, cancel: bool, grace: float = STOP_GRACE_SECS
) -> None:
    """Wait (at most ``grace`` seconds) for ``tasks`` to end, cancelling them first if ``cancel``.

    A stop must end even when a task does not: one cancelled inside a client call whose
    connection is gone (a Redis restart, a silent peer) can hold its cancellation for as long as
    that library's own timeouts.  Such a task is cancelled (again), named in a warning with the
    stack it is stuck in, and left behind; what it held (a lease, a lock) expires in Redis."""
    if cancel:
        for t in tasks:
            t.cancel()
    if not tasks:
        return
    done, late = await asyncio.wait(tasks, timeout=grace)
    for t in late:
        t.cancel()
        out = io.StringIO()
        t.print_stack(file=out)
        log.warning(
            "%s: task %s did not end within %.0f s of the stop; left behind:\n%s",
            label,
            t.get_name(),
            grace,
            out.getvalue(),
        )
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.debug("%s: task %s ended with %r", label, t.get_name(), t.exception())
