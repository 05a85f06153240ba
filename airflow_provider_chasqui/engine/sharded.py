"""Scale-out: one logical queue and schedule set spread over N queues ``<name>.<i>``.

``ShardedQueue`` routes every spec operation by a stable hash of the spec key (see
``core/sharding.py``) and hides the shards: upsert, get, list, pause, resume, trigger and
remove take the same arguments as on ``Queue``.  ``ShardedWorker`` runs one ``Worker`` per
shard in one process (each with its embedded promoter and scheduler), so a fleet of them
serves every shard; ``chasqui scheduler --shards N`` is
the standalone scheduler of a sharded set.  With a ``?cluster=true`` URL each shard's keys
live on whichever Redis Cluster node owns that shard's hash slot.

``sync/sharded.py`` is the blocking twin of ``ShardedQueue``.
"""

from __future__ import annotations

import asyncio
import random
import signal
from collections.abc import Callable, Mapping, Sequence
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
from ..errors import ConfigError
from ..types import Job
from ._driver import AsyncDriver
from .queue import Queue

__all__ = ["ShardedQueue", "AsyncShardedQueue", "ShardedWorker"]


class ShardedQueue:
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
        driver: AsyncDriver | None = None,
        credential_provider: Any = None,
    ) -> None:
        names = shard_queue_names(name, shards)
        redis_url = client_url(redis_url, tls)  # a ConfigError for a bad URL, or TLS on unix://
        register_credentials(redis_url, credential_provider)  # every client of this URL (credentials.py)
        self._name = name
        self._url = redis_url
        self._fast_paths = fast_paths
        self._driver = driver
        self.queues = [Queue(n, settings=settings, driver=_Lazy(self)) for n in names]  # type: ignore[arg-type]
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
    def driver(self) -> AsyncDriver:
        """One connection pool (or cluster client) shared by every shard."""
        if self._driver is None:
            self._driver = AsyncDriver(
                self._url, fast_paths=self._fast_paths, socket_timeout=read_timeout(WAIT_BLOCK_MS)
            )
        return self._driver

    def shard_for(self, key: str) -> Queue:
        """The shard queue holding spec ``key``."""
        return self.queues[shard_of(key, len(self.queues))]

    # ---- jobs --------------------------------------------------------------------------
    async def add(self, name: str, data: Any, *, job_id: str | None = None, repeat: Any = None, **options: Any) -> Job:
        """A job on the shard of its ``job_id`` (random without one); with ``repeat``, a spec
        on the shard of its key."""
        if repeat is not None:  # the shard's Queue.add checks the options as it does unsharded
            spec_key = sharded_spec_key(name, repeat, None, {**options, "job_id": job_id})
            return await self.shard_for(spec_key).add(name, data, job_id=job_id, repeat=repeat, **options)
        group = options.get("group")
        if group is not None:  # a group lives on one shard: its turn and its limits are whole there
            queue = self.shard_for(check_group(group))
        else:
            queue = self.shard_for(job_id) if job_id is not None else random.choice(self.queues)
        return await queue.add(name, data, job_id=job_id, **options)

    # ---- repeatable specs --------------------------------------------------------------
    async def upsert_repeatable_job(
        self, name: str, data: Any, *, repeat: Any, key: str | None = None, **options: Any
    ) -> Job:
        spec_key = sharded_spec_key(name, repeat, key, options)
        return await self.shard_for(spec_key).upsert_repeatable_job(name, data, repeat=repeat, key=key, **options)

    async def upsert_repeatable_bulk(self, specs: Sequence[Mapping[str, Any]]) -> list[str]:
        """Specs grouped by shard, every shard's group written concurrently; keys in input order."""
        specs = list(specs)
        n = len(self.queues)
        indexed = split_by_shard(list(enumerate(specs)), [bulk_spec_key(s) for s in specs], n)  # type: ignore[arg-type]
        results = await asyncio.gather(
            *(self.queues[i].upsert_repeatable_bulk([s for _j, s in group]) for i, group in indexed.items())
        )
        out: list[str] = [""] * len(specs)
        for group, keys in zip(indexed.values(), results):
            for (j, _s), key in zip(group, keys):
                out[j] = key
        return out

    async def get_repeatable_job(self, key: str) -> RepeatableInfo | None:
        return await self.shard_for(key).get_repeatable_job(key)

    async def remove_repeatable_by_key(self, key: str) -> bool:
        return await self.shard_for(key).remove_repeatable_by_key(key)

    async def pause_repeatable(self, key: str) -> bool:
        return await self.shard_for(key).pause_repeatable(key)

    async def resume_repeatable(self, key: str) -> bool:
        return await self.shard_for(key).resume_repeatable(key)

    async def trigger_repeatable(self, key: str) -> Job | None:
        return await self.shard_for(key).trigger_repeatable(key)

    async def list_repeatable(
        self, cursor: str | None = None, count: int = 100
    ) -> tuple[list[RepeatableInfo], str | None]:
        """One page across the shards, one shard after another; the cursor names the shard."""
        shard, inner = decode_cursor(cursor, len(self.queues))
        items, nxt = await self.queues[shard].list_repeatable(inner, count)
        if nxt is None and shard + 1 < len(self.queues):
            return items, encode_cursor(shard + 1, "")
        return items, encode_cursor(shard, nxt)

    async def get_repeatable_jobs(self, limit: int = 100) -> list[RepeatableMeta]:
        """The first ``limit`` active specs of all shards by next fire."""
        pages = await asyncio.gather(*(q.get_repeatable_jobs(limit) for q in self.queues))
        return sorted((m for page in pages for m in page), key=lambda m: (m.next_fire_ms, m.key))[:limit]

    async def get_quarantined(self) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        for page in await asyncio.gather(*(q.get_quarantined() for q in self.queues)):
            out.update(page)
        return out

    # ---- counts: every shard together ---------------------------------------------------
    async def get_job_counts(self, *types: str) -> dict[str, int]:
        """Each shard's ``Queue.get_job_counts`` summed (``paused``: 1 when every shard is)."""
        return merge_counts(list(await asyncio.gather(*(q.get_job_counts(*types) for q in self.queues))))

    async def count(self) -> int:
        """The jobs not ended yet on every shard: waiting + active + delayed."""
        return job_total(await self.get_job_counts("waiting", "active", "delayed"))

    # ---- flow control: every shard together ---------------------------------------------
    async def pause(self) -> None:
        await asyncio.gather(*(q.pause() for q in self.queues))

    async def resume(self) -> None:
        await asyncio.gather(*(q.resume() for q in self.queues))

    async def is_paused(self) -> bool:
        """True when every shard is paused."""
        return all(await asyncio.gather(*(q.is_paused() for q in self.queues)))

    async def set_rate_limit(self, max_jobs: int, per_ms: int) -> None:
        """At most ``max_jobs`` per ``per_ms`` over all shards: each shard gets its share
        (``split_limit``), so ``max_jobs`` must be at least the shard count."""
        shares = split_limit("max_jobs", max_jobs, len(self.queues), MAX_RATE_JOBS)
        await asyncio.gather(*(q.set_rate_limit(m, per_ms) for q, m in zip(self.queues, shares)))

    async def get_rate_limit(self) -> RateLimit | None:
        """The shards' limits summed (None unless every shard has one, all per the same window)."""
        return sum_rate_limits(await asyncio.gather(*(q.get_rate_limit() for q in self.queues)))

    async def clear_rate_limit(self) -> None:
        await asyncio.gather(*(q.clear_rate_limit() for q in self.queues))

    async def set_concurrency(self, n: int | None) -> None:
        """At most ``n`` jobs running over all shards: each shard gets its share (``split_limit``)."""
        if n is None:
            await self.clear_concurrency()
            return
        shares = split_limit("concurrency", n, len(self.queues), MAX_CONCURRENCY)
        await asyncio.gather(*(q.set_concurrency(m) for q, m in zip(self.queues, shares)))

    async def get_concurrency(self) -> int | None:
        """The shards' limits summed (None unless every shard has one)."""
        got = await asyncio.gather(*(q.get_concurrency() for q in self.queues))
        return None if None in got else sum(got)  # type: ignore[arg-type]

    async def clear_concurrency(self) -> None:
        await asyncio.gather(*(q.clear_concurrency() for q in self.queues))

    async def set_group_limits(
        self,
        concurrency: int | None = None,
        max_jobs: int | None = None,
        per_ms: int | None = None,
        group: str | None = None,
    ) -> None:
        """A group's limits (or the default of every group) on every shard: a group lives on
        one shard (``add`` routes it there), so its limits hold whole."""
        await asyncio.gather(*(q.set_group_limits(concurrency, max_jobs, per_ms, group) for q in self.queues))

    async def get_group_limits(self, group: str | None = None) -> GroupLimits:
        """The limits ``group`` obeys on its shard (the default: as the first shard reads it)."""
        queue = self.queues[0] if group is None else self.shard_for(check_group(group))
        return await queue.get_group_limits(group)

    async def clear_group_limits(self, group: str | None = None) -> None:
        await asyncio.gather(*(q.clear_group_limits(group) for q in self.queues))

    # ---- lifecycle ---------------------------------------------------------------------
    async def close(self) -> None:
        if self._driver is not None:
            await self._driver.close()
            self._driver = None
        self._closed = True

    async def __aenter__(self) -> ShardedQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


AsyncShardedQueue = ShardedQueue


class _Lazy:
    """Stands in for the shared driver until first use, so constructing opens nothing."""

    def __init__(self, owner: ShardedQueue) -> None:
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._owner.driver, name)


class ShardedWorker:
    """One ``Worker`` per shard, in this process; each also runs its shard's promoter and
    scheduler (leader-locked per shard, so any number of ShardedWorkers may run)."""

    def __init__(
        self,
        name: str,
        handler: Any,
        *,
        shards: int,
        redis_url: str = DEFAULT_URL,
        install_signal_handlers: bool = False,
        **worker_options: Any,
    ) -> None:
        from .worker import Worker  # producers never pay for the worker

        if "queue_name" in worker_options:
            raise ConfigError("ShardedWorker takes the logical name; the shards are <name>.<i>")
        self.name = name
        self.workers = [
            Worker(q, handler, redis_url=redis_url, **worker_options) for q in shard_queue_names(name, shards)
        ]
        self._signals = install_signal_handlers

    @property
    def processed(self) -> int:
        return sum(getattr(w, "processed", 0) for w in self.workers)

    def on(self, event: str, callback: Callable[..., Any]) -> Callable[..., Any]:
        """``Worker.on`` on every shard's worker: job events once per job; ``drained``,
        ``paused``, ``resumed`` and ``closed`` once per shard."""
        for w in self.workers:
            w.on(event, callback)
        return callback

    def off(self, event: str, callback: Callable[..., Any] | None = None) -> None:
        for w in self.workers:
            w.off(event, callback)

    def pause(self) -> None:
        """``Worker.pause`` on every shard's worker."""
        for w in self.workers:
            w.pause()

    def resume(self) -> None:
        for w in self.workers:
            w.resume()

    def is_paused(self) -> bool:
        return all(w.is_paused() for w in self.workers)

    async def run(self) -> None:
        if self._signals:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.close()))
        await asyncio.gather(*(w.run() for w in self.workers))

    async def close(self) -> None:
        await asyncio.gather(*(w.close() for w in self.workers))

    async def __aenter__(self) -> ShardedWorker:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
