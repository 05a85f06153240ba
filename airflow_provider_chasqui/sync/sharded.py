"""``SyncShardedQueue``: the blocking twin of ``engine/sharded.py``'s ``ShardedQueue``.

Same methods, same routing (``core/sharding.py``), no ``await``.  Thread-safe.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.controls import MAX_CONCURRENCY, MAX_RATE_JOBS, RateLimit, sum_rate_limits
from ..core.groups import GroupLimits, check_group
from ..core.listing import job_total, merge_counts
from ..core.repeat import RepeatableMeta
from ..core.schedules import bulk_spec_key, sharded_spec_key
from ..core.settings import QueueSettings
from ..core.sharding import (
    decode_cursor,
    encode_cursor,
    shard_of,
    shard_queue_names,
    split_by_shard,
    split_limit,
)
from ..core.spec_reads import RepeatableInfo
from ..core.urls import DEFAULT_URL, WAIT_BLOCK_MS, client_url, read_timeout
from ..credentials import register as register_credentials
from ..types import Job
from ._driver import SyncDriver
from .queue import SyncQueue

__all__ = ["SyncShardedQueue"]


class SyncShardedQueue:
    """Producer and spec manager over ``shards`` queues ``<name>.0`` .. ``<name>.<shards-1>``."""

    def __init__(
        self,
        name: str,
        shards: int,
        *,
        redis_url: str = DEFAULT_URL,
        tls: bool = False,
        settings: QueueSettings | None = None,
        fast_paths: bool | None = None,
        driver: SyncDriver | None = None,
        credential_provider: Any = None,
    ) -> None:
        names = shard_queue_names(name, shards)
        redis_url = client_url(redis_url, tls)  # a ConfigError for a bad URL, or TLS on unix://
        register_credentials(redis_url, credential_provider)  # every client of this URL (credentials.py)
        self._name = name
        self._url = redis_url
        self._fast_paths = fast_paths
        self._driver = driver
        self.queues = [SyncQueue(n, settings=settings, driver=_Lazy(self)) for n in names]  # type: ignore[arg-type]
        self._closed = False

    @property
    def name(self) -> str:
        return self._name

    @property
    def shards(self) -> int:
        return len(self.queues)

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def driver(self) -> SyncDriver:
        """One connection pool (or cluster client) shared by every shard."""
        if self._driver is None:
            self._driver = SyncDriver(
                self._url, fast_paths=self._fast_paths, socket_timeout=read_timeout(WAIT_BLOCK_MS)
            )
        return self._driver

    def shard_for(self, key: str) -> SyncQueue:
        """The shard queue holding spec ``key``."""
        return self.queues[shard_of(key, len(self.queues))]

    # ---- jobs --------------------------------------------------------------------------
    def add(self, name: str, data: Any, *, job_id: str | None = None, repeat: Any = None, **options: Any) -> Job:
        """A job on the shard of its ``job_id`` (random without one); with ``repeat``, a spec
        on the shard of its key."""
        if repeat is not None:  # the shard's Queue.add checks the options as it does unsharded
            spec_key = sharded_spec_key(name, repeat, None, {**options, "job_id": job_id})
            return self.shard_for(spec_key).add(name, data, job_id=job_id, repeat=repeat, **options)
        group = options.get("group")
        if group is not None:  # a group lives on one shard: its turn and its limits are whole there
            queue = self.shard_for(check_group(group))
        else:
            queue = self.shard_for(job_id) if job_id is not None else random.choice(self.queues)
        return queue.add(name, data, job_id=job_id, **options)

    # ---- repeatable specs --------------------------------------------------------------
    def upsert_repeatable_job(
        self, name: str, data: Any, *, repeat: Any, key: str | None = None, **options: Any
    ) -> Job:
        spec_key = sharded_spec_key(name, repeat, key, options)
        return self.shard_for(spec_key).upsert_repeatable_job(name, data, repeat=repeat, key=key, **options)

    def upsert_repeatable_bulk(self, specs: Sequence[Mapping[str, Any]]) -> list[str]:
        """Specs grouped by shard, one shard's group after another; keys in input order."""
        specs = list(specs)
        n = len(self.queues)
        indexed = split_by_shard(list(enumerate(specs)), [bulk_spec_key(s) for s in specs], n)  # type: ignore[arg-type]
        results = [self.queues[i].upsert_repeatable_bulk([s for _j, s in group]) for i, group in indexed.items()]
        out: list[str] = [""] * len(specs)
        for group, keys in zip(indexed.values(), results):
            for (j, _s), key in zip(group, keys):
                out[j] = key
        return out

    def get_repeatable_job(self, key: str) -> RepeatableInfo | None:
        return self.shard_for(key).get_repeatable_job(key)

    def remove_repeatable_by_key(self, key: str) -> bool:
        return self.shard_for(key).remove_repeatable_by_key(key)

    def pause_repeatable(self, key: str) -> bool:
        return self.shard_for(key).pause_repeatable(key)

    def resume_repeatable(self, key: str) -> bool:
        return self.shard_for(key).resume_repeatable(key)

    def trigger_repeatable(self, key: str) -> Job | None:
        return self.shard_for(key).trigger_repeatable(key)

    def list_repeatable(self, cursor: str | None = None, count: int = 100) -> tuple[list[RepeatableInfo], str | None]:
        """One page across the shards, one shard after another; the cursor names the shard."""
        shard, inner = decode_cursor(cursor, len(self.queues))
        items, nxt = self.queues[shard].list_repeatable(inner, count)
        if nxt is None and shard + 1 < len(self.queues):
            return items, encode_cursor(shard + 1, "")
        return items, encode_cursor(shard, nxt)

    def get_repeatable_jobs(self, limit: int = 100) -> list[RepeatableMeta]:
        """The first ``limit`` active specs of all shards by next fire."""
        pages = [q.get_repeatable_jobs(limit) for q in self.queues]
        return sorted((m for page in pages for m in page), key=lambda m: (m.next_fire_ms, m.key))[:limit]

    def get_quarantined(self) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for page in (q.get_quarantined() for q in self.queues):
            out.update(page)
        return out

    # ---- counts: every shard together ---------------------------------------------------
    def get_job_counts(self, *types: str) -> dict[str, int]:
        """Each shard's ``Queue.get_job_counts`` summed (``paused``: 1 when every shard is)."""
        return merge_counts([q.get_job_counts(*types) for q in self.queues])

    def count(self) -> int:
        """The jobs not ended yet on every shard: waiting + active + delayed."""
        return job_total(self.get_job_counts("waiting", "active", "delayed"))

    # ---- flow control: every shard together ---------------------------------------------
    def pause(self) -> None:
        for q in self.queues:
            q.pause()

    def resume(self) -> None:
        for q in self.queues:
            q.resume()

    def is_paused(self) -> bool:
        """True when every shard is paused."""
        return all(q.is_paused() for q in self.queues)

    def set_rate_limit(self, max_jobs: int, per_ms: int) -> None:
        """At most ``max_jobs`` per ``per_ms`` over all shards: each shard gets its share
        (``split_limit``), so ``max_jobs`` must be at least the shard count."""
        for q, m in zip(self.queues, split_limit("max_jobs", max_jobs, len(self.queues), MAX_RATE_JOBS)):
            q.set_rate_limit(m, per_ms)

    def get_rate_limit(self) -> RateLimit | None:
        """The shards' limits summed (None unless every shard has one, all per the same window)."""
        return sum_rate_limits([q.get_rate_limit() for q in self.queues])

    def clear_rate_limit(self) -> None:
        for q in self.queues:
            q.clear_rate_limit()

    def set_concurrency(self, n: int | None) -> None:
        """At most ``n`` jobs running over all shards: each shard gets its share (``split_limit``)."""
        if n is None:
            self.clear_concurrency()
            return
        for q, m in zip(self.queues, split_limit("concurrency", n, len(self.queues), MAX_CONCURRENCY)):
            q.set_concurrency(m)

    def get_concurrency(self) -> int | None:
        """The shards' limits summed (None unless every shard has one)."""
        got = [q.get_concurrency() for q in self.queues]
        return None if None in got else sum(got)  # type: ignore[arg-type]

    def clear_concurrency(self) -> None:
        for q in self.queues:
            q.clear_concurrency()

    def set_group_limits(
        self,
        concurrency: int | None = None,
        max_jobs: int | None = None,
        per_ms: int | None = None,
        group: str | None = None,
    ) -> None:
        """A group's limits (or the default of every group) on every shard: a group lives on
        one shard (``add`` routes it there), so its limits hold whole."""
        for q in self.queues:
            q.set_group_limits(concurrency, max_jobs, per_ms, group)

    def get_group_limits(self, group: str | None = None) -> GroupLimits:
        """The limits ``group`` obeys on its shard (the default: as the first shard reads it)."""
        queue = self.queues[0] if group is None else self.shard_for(check_group(group))
        return queue.get_group_limits(group)

    def clear_group_limits(self, group: str | None = None) -> None:
        for q in self.queues:
            q.clear_group_limits(group)

    # ---- lifecycle ---------------------------------------------------------------------
    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None
        self._closed = True

    def __enter__(self) -> SyncShardedQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Lazy:
    """Stands in for the shared driver until first use, so constructing opens nothing."""

    def __init__(self, owner: SyncShardedQueue) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner.driver, name)
