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

from .core.repeat import MissedFiresPolicy, RepeatableMeta, RepeatPattern
from .core.schedules import RepeatableInfo
from .engine.events import QueueEvents
from .engine.promoter import Promoter
from .engine.queue import Queue
from .engine.scheduler import Scheduler
from .engine.sharded import ShardedQueue, ShardedWorker
from .engine.worker import Handler, Worker, WorkerSettings
from .errors import (
    ChasquiConnectionError,
    ChasquiError,
    CodecError,
    ConfigError,
    JobFailed,
    JobNotFound,
    NotSupportedError,
    ScriptError,
    UnrecoverableError,
)
from .sync.queue import SyncQueue
from .sync.sharded import SyncShardedQueue
from .types import BackoffSpec, Job, QueueEvent

_logging.getLogger(__name__).addHandler(_logging.NullHandler())

__version__ = "0.1.0"
AsyncQueue = Queue
AsyncShardedQueue = ShardedQueue

__all__ = [
    "AsyncQueue",
    "AsyncShardedQueue",
    "BackoffSpec",
    "ChasquiConnectionError",
    "ChasquiError",
    "CodecError",
    "ConfigError",
    "Handler",
    "Job",
    "JobFailed",
    "JobNotFound",
    "MissedFiresPolicy",
    "NotSupportedError",
    "Promoter",
    "Queue",
    "QueueEvent",
    "QueueEvents",
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
    "Worker",
    "WorkerSettings",
    "version",
]


def version() -> str:
    return __version__
