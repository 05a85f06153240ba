"""airflow-provider-chasqui: a ChasquiMQ-compatible Redis job queue and cron scheduler.

The public surface is a superset of the ``chasquimq`` Python package (``Queue``, ``Worker``,
``QueueEvents``, ``Job``, ``BackoffSpec``, ``RepeatPattern``, ``UnrecoverableError``...), plus
the blocking ``SyncQueue`` for Airflow hooks and ``ShardedQueue``/``ShardedWorker`` to spread
one schedule set over many queues (and Redis Cluster nodes).  Importing this package never
imports Airflow or PySpark; the Airflow classes live in ``hooks``, ``operators``, ``sensors``,
``triggers``.
"""

from __future__ import annotations

import logging as _logging
from importlib import import_module as _import_module
from typing import TYPE_CHECKING, Any

from .errors import (
    ChasquiConnectionError,
    ChasquiError,
    ChildProcessDied,
    CodecError,
    ConfigError,
    HandlerNotFound,
    JobFailed,
    JobNotFound,
    JobTimeout,
    NotSupportedError,
    RateLimited,
    ReconnectLimitError,
    ScriptError,
    UnrecoverableError,
    WrongTypeError,
)

if TYPE_CHECKING:  # what ``__getattr__`` below imports on first use
    from .core.controls import RateLimit
    from .core.repeat import MissedFiresPolicy, RepeatableMeta, RepeatPattern
    from .core.spec_reads import RepeatableInfo
    from .engine.events import QueueEvents
    from .engine.promoter import Promoter
    from .engine.queue import Queue
    from .engine.scheduler import Scheduler
    from .engine.sharded import ShardedQueue, ShardedWorker
    from .engine.worker import Handler, Worker, WorkerSettings
    from .sync.queue import SyncQueue
    from .sync.sharded import SyncShardedQueue
    from .types import BackoffSpec, Job, JobFailure, QueueEvent

    AsyncQueue = Queue
    AsyncShardedQueue = ShardedQueue

_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__version__ = "0.1.0"

# name -> (module, attribute): imported on first use (PEP 562), so importing this package (or
# ``core``, which every other part builds on) loads no redis, asyncio or socket code
_LAZY: dict[str, tuple[str, str]] = {
    "MissedFiresPolicy": (".core.repeat", "MissedFiresPolicy"),
    "RepeatableMeta": (".core.repeat", "RepeatableMeta"),
    "RepeatPattern": (".core.repeat", "RepeatPattern"),
    "RepeatableInfo": (".core.spec_reads", "RepeatableInfo"),
    "QueueEvents": (".engine.events", "QueueEvents"),
    "Promoter": (".engine.promoter", "Promoter"),
    "Queue": (".engine.queue", "Queue"),
    "AsyncQueue": (".engine.queue", "Queue"),
    "Scheduler": (".engine.scheduler", "Scheduler"),
    "ShardedQueue": (".engine.sharded", "ShardedQueue"),
    "AsyncShardedQueue": (".engine.sharded", "ShardedQueue"),
    "ShardedWorker": (".engine.sharded", "ShardedWorker"),
    "Handler": (".engine.worker", "Handler"),
    "Worker": (".engine.worker", "Worker"),
    "WorkerSettings": (".engine.worker", "WorkerSettings"),
    "SyncQueue": (".sync.queue", "SyncQueue"),
    "SyncShardedQueue": (".sync.sharded", "SyncShardedQueue"),
    "BackoffSpec": (".types", "BackoffSpec"),
    "RateLimit": (".core.controls", "RateLimit"),
    "GroupLimits": (".core.groups", "GroupLimits"),
    "Job": (".types", "Job"),
    "JobFailure": (".types", "JobFailure"),
    "QueueEvent": (".types", "QueueEvent"),
}
_SUBMODULES = frozenset(
    {
        "cli",
        "compat",
        "core",
        "dashboard",
        "demo",
        "engine",
        "errors",
        "examples",
        "get_provider_info",
        "hooks",
        "operators",
        "ops",
        "queues",
        "sensors",
        "spark",
        "sync",
        "tracing",
        "triggers",
        "types",
        "worker",
    }
)


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is not None:
        value = getattr(_import_module(target[0], __name__), target[1])
        globals()[name] = value  # later lookups are plain attribute reads
        return value
    if name in _SUBMODULES:  # ``airflow_provider_chasqui.engine`` without importing it first, as before
        return _import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "AsyncQueue",
    "AsyncShardedQueue",
    "BackoffSpec",
    "ChasquiConnectionError",
    "ReconnectLimitError",
    "ChasquiError",
    "ChildProcessDied",
    "CodecError",
    "ConfigError",
    "Handler",
    "HandlerNotFound",
    "Job",
    "JobFailed",
    "JobFailure",
    "JobNotFound",
    "MissedFiresPolicy",
    "NotSupportedError",
    "Promoter",
    "GroupLimits",
    "Queue",
    "QueueEvent",
    "QueueEvents",
    "RateLimit",
    "JobTimeout",
    "RateLimited",
    "RepeatPattern",
    "RepeatableInfo",
    "RepeatableMeta",
    "Scheduler",
    "ScriptError",
    "ShardedQueue",
    "ShardedWorker",
    "SyncQueue",
    "SyncShardedQueue",
    "UnrecoverableError",
    "WrongTypeError",
    "Worker",
    "WorkerSettings",
    "version",
]


def version() -> str:
    return __version__
