"""``SyncQueue``: the blocking twin of ``engine/queue.py`` for Airflow hooks and operators.

Same methods, same flows, no ``await``; a test checks the two stay twins.  Thread-safe.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Mapping, Sequence

from ..core.producer import QueueFlows, single_outcome
from ..core.settings import QueueSettings
from ..engine.queue import DEFAULT_URL, window_to_ms
from ..errors import ConfigError
from ..types import Job
from ._driver import SyncDriver

__all__ = ["SyncQueue"]


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class SyncQueue:
    """Blocking producer for one queue; the connection pool opens lazily on first use."""

    def __init__(self, name: str, *, redis_url: str = DEFAULT_URL, tls: bool = False,
                 max_stream_len: int | None = None, max_delay_secs: int | None = None,
                 settings: QueueSettings | None = None, fast_paths: bool | None = None,
                 driver: SyncDriver | None = None) -> None:
        overrides = {k: v for k, v in (("max_stream_len", max_stream_len), ("max_delay_secs", max_delay_secs)) if v is not None}
        if settings is not None and overrides:
            raise ConfigError("pass settings= or the individual limits, not both")
        settings = settings or QueueSettings(**overrides)
        self._flows = QueueFlows(name, settings)
        if tls and redis_url.startswith("redis://"):
            redis_url = "rediss://" + redis_url[len("redis://"):]
        self._url = redis_url
        self._fast_paths = fast_paths
        self._driver = driver
        self._closed = False

    @property
    def name(self) -> str:
        return self._flows.keys.queue

    @property
    def keys(self):  # noqa: ANN201 - QueueKeys, for hooks and tools
        return self._flows.keys

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def driver(self) -> SyncDriver:
        if self._driver is None:
            self._driver = SyncDriver(self._url, fast_paths=self._fast_paths)
        return self._driver

    def _job(self, jid: str, created: int, name: str, data: Any) -> Job:
        return Job(id=jid, name=name, data=data, attempt=0, created_at_ms=created)

    # ---- adding ------------------------------------------------------------------------
    def add(self, name: str, data: Any, *, delay: Any = None, delay_ms: Any = None, attempts: int | None = None,
            backoff: Any = None, job_id: str | None = None, repeat: Any = None, missed_fires: Any = None) -> Job:
        """Enqueue one job (or upsert a repeatable spec when ``repeat`` is given)."""
        if repeat is not None:
            return self.upsert_repeatable_job(name, data, repeat=repeat, attempts=attempts, backoff=backoff,
                                              key=job_id, missed_fires=missed_fires)
        if missed_fires is not None:
            raise ConfigError("missed_fires only applies together with repeat=")
        flow = self._flows.enqueue(name, data, delay=delay, delay_ms=delay_ms, attempts=attempts,
                                   backoff=backoff, job_id=job_id)
        jid, created = self.driver.run(flow)
        return self._job(jid, created, name, data)

    def add_unique(self, name: str, data: Any, *, job_id: str | None = None, key: str | None = None,
                   window: timedelta | float = timedelta(hours=1), delay: Any = None, delay_ms: Any = None,
                   attempts: int | None = None, backoff: Any = None) -> Job:
        """Add unless the same unique key was added within ``window``; then return the first job."""
        flow = self._flows.enqueue_unique(name, data, job_id=job_id, key=key, window_ms=window_to_ms(window),
                                          delay=delay, delay_ms=delay_ms, attempts=attempts, backoff=backoff)
        jid, created = self.driver.run(flow)
        return self._job(jid, created, name, data)

    def add_bulk(self, jobs: Sequence[Mapping[str, Any]]) -> list[Job]:
        """Enqueue many jobs: one script call per 1,000 jobs, all in one round trip."""
        rows = self.driver.run(self._flows.enqueue_bulk(list(jobs)))
        return [self._job(*row) for row in rows]

    def cancel_delayed(self, job_id: str) -> bool:
        return self.driver.run(self._flows.cancel_delayed(job_id))

    # ---- dead letters ------------------------------------------------------------------
    def peek_dlq(self, limit: int = 20) -> list[dict[str, Any]]:
        return self.driver.run(self._flows.peek_dlq(limit))

    def replay_dlq(self, limit: int = 100) -> int:
        return self.driver.run(self._flows.replay_dlq(limit))

    # ---- results (workers started with store_results=True) -------------------------------
    def get_job_result(self, job_id: str) -> Any:
        return self.driver.run(self._flows.get_result(job_id))

    def get_job_result_bulk(self, job_ids: Sequence[str]) -> list[Any]:
        return self.driver.run(self._flows.get_results(list(job_ids)))

    def get_job_state(self, job_id: str) -> str:
        """``completed``, ``failed`` (in the DLQ), ``delayed`` or ``unknown``."""
        return self.driver.run(self._flows.get_job_state(job_id))

    def wait_for_results(self, job_ids: Sequence[str], timeout: float = 30.0) -> dict[str, tuple[Any, ...]]:
        """Block on the events stream until the jobs end; see ``QueueFlows.wait_for_jobs``."""
        flow = self._flows.wait_for_jobs(job_ids, int(timeout * 1000), _monotonic_ms)
        return self.driver.run(flow)

    def wait_for_result(self, job_id: str, timeout: float = 30.0) -> Any:
        """The handler's return value; ``JobFailed`` if it was dead-lettered, ``TimeoutError`` at the deadline."""
        return single_outcome(job_id, self.wait_for_results([job_id], timeout), timeout)

    # ---- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None
        self._closed = True

    def __enter__(self) -> "SyncQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
