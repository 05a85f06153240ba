"""What both event-driven watchers share: the shared-stream API of Airflow 3.3+, batching
limits, back-pressure, the batch payload, how a watcher opens its queue.

The watchers themselves: ``queue_watcher.py`` (the jobs of a queue, through the consumer
intake) and ``completion_watcher.py`` (the ``completed`` events of a queue); the trigger that
Airflow serializes and the module documentation users read: ``queue_events.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from airflow.sdk.exceptions import AirflowOptionalProviderFeatureException

try:
    from airflow.triggers.shared_stream import (
        AdvanceItem,
        AdvanceOutcome,
        SharedStreamProducer,
        reject_shared_stream_event,
    )
except ImportError as exc:  # pragma: no cover - Airflow < 3.3
    raise AirflowOptionalProviderFeatureException(
        "Chasqui event-driven triggers need Airflow 3.3+ (airflow.triggers.shared_stream)"
    ) from exc

from ..core.pacing import Backoff
from ..engine.cancellation import raise_if_cancelling
from ..engine.queue import Queue
from ..errors import TRANSIENT_ERRORS
from ..hooks.chasqui import ChasquiHook

__all__ = [
    "AdvanceItem",
    "AdvanceOutcome",
    "SharedStreamProducer",
    "reject_shared_stream_event",
    "DEFAULT_MAX_BATCH",
    "MAX_BATCH_LIMIT",
    "DEFAULT_LINGER_MS",
    "ADVANCE_TRIES",
    "TRANSIENT",
    "Flow",
    "check_batching",
    "batch_payload",
    "open_queue",
    "watcher_backoff",
]

DEFAULT_MAX_BATCH = 100
MAX_BATCH_LIMIT = 1000  # an asset event's ``extra`` is one JSON value in the metadata database
DEFAULT_LINGER_MS = 100
MAX_COLLECT_SECS = 1.0  # a batch stops growing after this long, even if jobs keep arriving
ADVANCE_TRIES = 3  # writes of an advance (acks, the cursor) before the error reaches Airflow
TRANSIENT: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, OSError)  # a raw socket error too


def watcher_backoff() -> Backoff:
    """0.4 s doubling to 5 s: a triggerer waits out an outage without spinning."""
    return Backoff(base=0.2, cap=5.0, max_doublings=5)


async def open_queue(conn_id: str, queue_name: str) -> Queue:
    return await ChasquiHook(conn_id).aget_queue(queue_name)


class Flow:
    """Back-pressure shared by both producers: at most ``limit`` batches yielded and not yet
    advanced.  Both use 1: a batch is read only once Airflow saved the previous one, so a burst
    that arrives meanwhile becomes one event, and events reach the metadata database in order
    and at least one triggerer sync apart (what keeps Airflow 3.3's asset scheduling from
    stranding them, see the module documentation).  ``gap_ms`` more after each advance widens
    that spacing for a slow scheduler."""

    def __init__(self, limit: int = 1, gap_ms: int = 0) -> None:
        self.limit = limit
        self.gap = gap_ms / 1000
        self.outstanding = 0
        self._room = asyncio.Event()
        self._ready_at = 0.0

    async def wait_for_room(self, timeout: float) -> bool:
        if self.outstanding >= self.limit:
            self._room.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._room.wait(), timeout)
            raise_if_cancelling()  # Python 3.11's wait_for may drop a cancel that races its end
            if self.outstanding >= self.limit:
                return False
        wait = self._ready_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(min(wait, timeout))
            return time.monotonic() >= self._ready_at
        return True

    def release(self, n: int) -> None:
        self.outstanding = max(0, self.outstanding - n)
        self._ready_at = time.monotonic() + self.gap
        self._room.set()


def check_batching(max_batch: Any, linger_ms: Any, event_gap_ms: Any = 0) -> None:
    if isinstance(max_batch, bool) or not isinstance(max_batch, int) or not 1 <= max_batch <= MAX_BATCH_LIMIT:
        raise ValueError(f"max_batch must be an integer from 1 to {MAX_BATCH_LIMIT}, got {max_batch!r}")
    if isinstance(linger_ms, bool) or not isinstance(linger_ms, int) or not 0 <= linger_ms <= 5000:
        raise ValueError(f"linger_ms must be an integer from 0 to 5000, got {linger_ms!r}")
    if isinstance(event_gap_ms, bool) or not isinstance(event_gap_ms, int) or not 0 <= event_gap_ms <= 600_000:
        raise ValueError(f"event_gap_ms must be an integer from 0 to 600000, got {event_gap_ms!r}")


def batch_payload(mode: str, queue: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"mode": mode, "queue": queue, "count": len(jobs), "jobs": jobs}
