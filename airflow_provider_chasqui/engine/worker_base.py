"""The state a ``Worker`` shares between its parts (``engine/worker.py``), and the helpers all
of them use.

The worker is one object in three layers: this base declares the state of a run and the small
steps every part takes (free reading room, count a job); ``engine/worker_outcomes.py`` buffers
outcomes and writes them (the flusher); ``engine/worker_slots.py`` runs the jobs (the slots,
pools, batches, timeouts, cancels); ``engine/worker.py`` reads and runs the whole.  Split by
concern, one class at run time: the hot path reads the same attributes as before.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, cast

import msgpack

from ..core.codec import validate_job_name
from ..core.consumer import ConsumerCore, Delivery
from ..core.pacing import LogBudget
from ..errors import ConfigError, HandlerNotFound
from ..types import Job

if TYPE_CHECKING:
    from .. import tracing as _tracing
    from ._driver import AsyncDriver
    from .intake import Intake
    from .metrics import WorkerMetrics
    from .pool_calls import Call, Outcomes
    from .process_pool import ProcessPool
    from .progress import ProgressReporter
    from .supervision import Supervisor
    from .worker_settings import WorkerSettings

__all__ = ["WorkerBase", "log"]

# one logger for every part of the worker: users filter and route on this name
log = logging.getLogger(__name__.rsplit(".", 1)[0] + ".worker")
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
POOL_RUN = 32  # pool calls a slot has out at once (see SlotRunner._slot)


def _resolve_handler(handler: Any) -> Callable[[Job], Any] | _Dispatch:
    """A callable, or a mapping of job name -> callable (unknown names raise HandlerNotFound:
    dead-lettered)."""
    if isinstance(handler, Mapping):
        table = dict(handler)
        for key, fn in table.items():
            validate_job_name(key)  # a key no job name can equal (not a str, no UTF-8) would never run
            if not callable(fn):
                raise ConfigError(f"handler for job name {key!r} is not callable")
            _check_takes_job(fn, f"handler for job name {key!r}")
        return _Dispatch(table)
    if not callable(handler):
        raise ConfigError(
            f"handler must be callable or a mapping of job name to callable, got {type(handler).__name__}"
        )
    _check_takes_job(handler, "handler")
    return cast("Callable[[Job], Any]", handler)


def _check_takes_job(fn: Any, where: str) -> None:
    """A handler the engine cannot call as ``fn(job)`` (``fn(jobs)`` for a batch) is a wiring
    error: refused here, not dead-lettering every job it is given.  A callable with no readable
    signature (some builtins) is trusted."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None)
    except TypeError as exc:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        raise ConfigError(
            f"{where} ({name}{signature}) cannot be called with one job ({exc}): a handler is fn(job), "
            "a batch handler fn(jobs)"
        ) from None


class _Dispatch:
    """Dispatch by job name; carries which handlers are coroutine functions."""

    def __init__(self, table: dict[str, Callable[[Job], Any]]) -> None:
        self.table = table

    def lookup(self, name: str) -> Callable[[Job], Any]:
        """The handler of job ``name``; ``HandlerNotFound`` (dead-lettered as unrecoverable) if none."""
        try:
            return self.table[name]
        except KeyError:
            raise HandlerNotFound.for_name(name) from None


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))  # noqa: B004 - a callable object's own __call__


class WorkerBase:
    """What the parts of a ``Worker`` share: its settings and identity (set by ``__init__``)
    and the state of one run (``Worker._run_state``, made once Redis answered)."""

    settings: WorkerSettings
    core: ConsumerCore
    consumer_id: str
    processed: int
    driver: AsyncDriver
    _handler: Callable[[Job], Any] | _Dispatch
    _procs: ProcessPool | None
    _sink: WorkerMetrics
    _tracer: _tracing.Tracer | None
    _stopping: asyncio.Event | None
    _unblock_task: asyncio.Future[None] | None
    # the run's state
    _intake: Intake
    _tasks: Supervisor
    _fail_log: LogBudget
    _deque: collections.deque[Delivery]  # read, not started (the slots pop it)
    _idle: list[asyncio.Future[None]]  # parked slots
    _done_rows: list[tuple[Any, ...]]  # complete_batch rows for the flusher
    _fail_rows: list[tuple[Any, ...]]  # fail_batch rows, and for the log of each:
    _fail_info: list[tuple[Any, ...]]  # (job_id, name, attempt, outcome, delay, traceback or exc)
    _acking: int  # entries in flight whose handler finished and whose ack is not yet done
    _async_fns: dict[Any, bool]
    _fn_timeouts: dict[Any, int]  # handlers with their own timeout (core/running.py)
    _fn_batches: dict[Any, int]  # batch handlers and their size (core/running.py)
    _current: dict[Any, Delivery | None]  # slot task -> the job whose handler it awaits
    _cancel_target: dict[Any, Delivery]  # slot task -> the job Queue.cancel stops in it
    _pooled: dict[Call, tuple[Delivery, int]]  # pool calls out, not settled -> (job, start ns)
    _box_waiting: list[Outcomes]  # slots awaiting pool calls, with room for more
    _flush_wanted: asyncio.Event
    _final_flush: bool
    _room_waiter: asyncio.Future[None] | None
    _emits: set[asyncio.Task[None]]  # `active` events in flight (Worker._admit)
    _progress: ProgressReporter
    _pool_size: int
    _executor: ThreadPoolExecutor

    @property
    def name(self) -> str:
        return self.core.keys.queue

    async def _unblock_reader(self) -> None:
        intake = getattr(self, "_intake", None)
        if intake is not None:
            await intake.unblock()

    async def _emitted(self) -> None:
        """Wait for the ``active`` events still in flight (see ``Worker._admit``)."""
        if self._emits:
            await asyncio.wait(tuple(self._emits))

    def _release(self, entry_id: bytes) -> None:
        self._intake.release(entry_id)
        self._room()

    def _room(self) -> None:
        """Wake a reader waiting for room (an entry left flight)."""
        waiter = self._room_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _count_processed(self) -> None:
        self.processed += 1
        limit = self.settings.max_jobs
        if limit is not None and self.processed >= limit and self._stopping is not None and not self._stopping.is_set():
            log.info("worker %s reached max_jobs=%d", self.consumer_id, limit)
            self._stopping.set()
            self._unblock_task = asyncio.ensure_future(self._unblock_reader())
