"""What a process pool's user holds (``engine/process_pool.py``): a :class:`Call` per pooled
job (sent to a child, ended once: a result, or an error of the pool's), the :class:`Outcomes`
box its slot waits on (one wake-up for however many calls ended) and ``CallCancelled`` for a
call ended by ``Queue.cancel``.  No pickling here: that stays in the two pool modules
(``tests/security/test_no_code_execution.py``).
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["Call", "CallCancelled", "Outcomes"]


class CallCancelled(Exception):
    """The outcome of a call ended by :meth:`ProcessPool.cancel` (``Queue.cancel``)."""


class Outcomes:
    """Where one submitter's calls report as they end: the calls ended since the last
    :meth:`take`, and one wake-up for all of them (a future per call cost the worker a task
    step per job, a third of a pooled no-op job's time)."""

    __slots__ = ("ended", "open", "waiter")

    def __init__(self) -> None:
        self.ended: list[Call] = []
        self.open = 0  # submitted, not yet taken
        self.waiter: asyncio.Future[None] | None = None

    def _add(self, call: Call) -> None:
        self.ended.append(call)
        self.nudge()

    def nudge(self) -> None:
        """End a :meth:`wait` early (its submitter has more to send)."""
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self) -> None:
        """Until at least one call has ended, or :meth:`nudge`."""
        if not self.ended:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None

    def take(self) -> list[Call]:
        ended, self.ended = self.ended, []
        self.open -= len(ended)
        return ended


class Call:
    """One handler call: sent to a child, then ended once (a result, or ``error``).  A plain
    class with slots: one is made per pooled job."""

    __slots__ = (
        "seq",
        "key",
        "batch",
        "fields",
        "timeout_ms",
        "job_id",
        "box",
        "child",
        "moving",
        "finished",
        "outcome",
        "error",
    )

    def __init__(
        self, seq: int, key: str | None, batch: bool, fields: Any, timeout_ms: int, job_id: str, box: Outcomes
    ) -> None:
        self.seq, self.key, self.batch = seq, key, batch
        self.fields = fields  # a job's (id, name, data, attempt, created_at_ms), or a list of them
        self.timeout_ms, self.job_id, self.box = timeout_ms, job_id, box
        self.child: Any = None  # the pool's child holding it (process_pool._Child), or None
        self.moving = False  # asked back from its child (``skip``) to go to an idle one
        self.finished = False
        self.outcome: tuple[bool, bytes] | None = None  # (ok, pickled result or (exception, traceback text))
        self.error: BaseException | None = None  # ended by the pool: timeout, cancel, a dead child
