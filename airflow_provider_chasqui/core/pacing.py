"""Pacing helpers with no I/O: how long to back off after a failure, how much to log.

One :class:`Backoff` serves every loop that retries through an outage (the consumer intake,
the worker's supervision, the queue-events watcher), so they all wait alike; one
:class:`LogBudget` caps how many failure records a consumer logs per window.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import ReconnectLimitError

__all__ = ["Backoff", "LogBudget"]


class Backoff:
    """Exponential backoff: ``base * 2**n`` seconds after the n-th failure in a row (n capped
    at ``max_doublings``), at most ``cap``; :meth:`reset` after a success."""

    __slots__ = ("base", "cap", "max_doublings", "failures")

    def __init__(self, base: float = 0.05, cap: float = 5.0, max_doublings: int = 7) -> None:
        self.base, self.cap, self.max_doublings = base, cap, max_doublings
        self.failures = 0

    def next(self) -> float:
        """Count one more failure; the seconds to wait before trying again."""
        self.failures += 1
        return self.delay(self.failures)

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (no state change)."""
        return float(min(self.base * 2 ** min(failures, self.max_doublings), self.cap))

    def reset(self) -> None:
        self.failures = 0

    def check_limit(self, limit: int | None, exc: BaseException) -> None:
        """``ReconnectLimitError`` once ``limit`` failures came in a row (None: no limit)."""
        if limit is not None and self.failures >= limit:
            raise ReconnectLimitError(
                f"gave up after {limit} failed attempts in a row to reach Redis (reconnect_max_attempts={limit}): {exc}"
            ) from exc


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
