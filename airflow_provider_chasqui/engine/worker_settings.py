"""``WorkerSettings``: every knob of a :class:`~airflow_provider_chasqui.engine.worker.Worker`,
validated once, and how chasquimq's keyword arguments map onto it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ..core.codec import U32_MAX
from ..core.controls import MAX_RATE_JOBS, MAX_RATE_PER_MS, RateLimit
from ..core.keys import check_consumer_name
from ..core.retry import RetryPolicy
from ..core.running import DEFAULT_MAX_RESULT_BYTES, MAX_RESULT_BYTES, check_timeout_ms
from ..core.settings import MAX_COUNT, MAX_MS, QueueSettings, check_int
from ..errors import ConfigError

__all__ = ["WorkerSettings", "DEFAULT_CONCURRENCY", "options_to_fields"]

DEFAULT_CONCURRENCY = 100  # chasquimq's Worker default


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkerSettings:
    """Every worker knob, validated once.  Defaults follow chasquimq's Python ``Worker``."""

    concurrency: int = DEFAULT_CONCURRENCY
    max_attempts: int = 25
    group: str = "default"
    consumer_id: str | None = None
    read_block_ms: int = 5000
    read_count: int = 256
    claim_min_idle_ms: int = 30_000
    events_enabled: bool = True
    delayed_enabled: bool = True
    run_scheduler: bool = True
    scheduler_tick_ms: int = 1000
    promoter_poll_ms: int = 100
    store_results: bool = False
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES  # a larger result fails its job (core/running.py)
    result_ttl_ms: int = 24 * 3600 * 1000
    failure_ttl_ms: int = 24 * 3600 * 1000
    ack_batch: int = 256
    ack_idle_ms: int = 5
    shutdown_deadline_secs: float = 30.0
    sync_threads: int | None = None
    max_jobs: int | None = None
    idle_exit_secs: float | None = None
    fail_log_burst: int = 20
    fail_log_window_secs: float = 60.0
    job_timeout_ms: int | None = None  # every attempt's timeout unless the job or its handler has one
    processes: int | None = None  # handlers in this many child processes (engine/process_pool.py)
    process_memory_mb: int | None = None  # a pool process past this resident size is replaced
    rate_limit: RateLimit | None = None  # chasquimq's rate_limit_max/_duration_ms: set as the queue's at start
    # chasquimq's stalled-job detector: a job reclaimed from consumers that stopped renewing it (a
    # dead or frozen worker) is a ``stalled`` event; the N-th time dead-letters it (``stalled``)
    stalled_detector_enabled: bool = True
    max_stalled_attempts: int | None = None  # None: only max_attempts bounds them (each reclaim is an attempt)
    # failed attempts in a row to reach Redis before run() gives up (ReconnectLimitError); None or 0: never
    reconnect_max_attempts: int | None = None
    retry: RetryPolicy = RetryPolicy()
    queue: QueueSettings = QueueSettings()

    def __post_init__(self) -> None:
        for name, most in _POSITIVE_INTS.items():
            check_int(name, getattr(self, name), 1, most)
        for name, most in _OPTIONAL_POSITIVE_INTS.items():
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1, most)
        for name, least, most in (("max_attempts", 0, U32_MAX), ("ack_idle_ms", 0, MAX_ACK_IDLE_MS)):
            check_int(name, getattr(self, name), least, most)
        if self.reconnect_max_attempts is not None:
            check_int("reconnect_max_attempts", self.reconnect_max_attempts, 0, MAX_COUNT)
            if self.reconnect_max_attempts == 0:  # chasquimq's "unbounded"
                object.__setattr__(self, "reconnect_max_attempts", None)
        for name in ("store_results", "events_enabled", "delayed_enabled", "run_scheduler", "stalled_detector_enabled"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        _seconds("shutdown_deadline_secs", self.shutdown_deadline_secs, zero=True)
        if self.idle_exit_secs is not None:
            _seconds("idle_exit_secs", self.idle_exit_secs, zero=True)
        _seconds("fail_log_window_secs", self.fail_log_window_secs, zero=False)
        if self.process_memory_mb is not None and self.processes is None:
            raise ConfigError("process_memory_mb limits pool processes: it needs processes=N")
        check_consumer_name(self.group)
        if self.consumer_id is not None:
            check_consumer_name(self.consumer_id, "consumer_id")
        if self.job_timeout_ms is not None:
            object.__setattr__(self, "job_timeout_ms", check_timeout_ms(self.job_timeout_ms, "job_timeout_ms"))


MAX_ACK_IDLE_MS = 60_000
#: Slots are tasks made at start: 100,000 take about 4 s and 200 MB; a million, a typo, took 2 GB.
MAX_WORKER_CONCURRENCY = 100_000
# field -> the largest value; each must be an int from 1 to it
_POSITIVE_INTS = {
    "concurrency": MAX_WORKER_CONCURRENCY,
    "read_count": MAX_COUNT,
    "ack_batch": MAX_COUNT,
    "fail_log_burst": MAX_COUNT,
    "read_block_ms": MAX_MS,
    "claim_min_idle_ms": MAX_MS,
    "scheduler_tick_ms": MAX_MS,
    "promoter_poll_ms": MAX_MS,
    "result_ttl_ms": MAX_MS,
    "failure_ttl_ms": MAX_MS,
    "max_result_bytes": MAX_RESULT_BYTES,
}
_OPTIONAL_POSITIVE_INTS = {
    "sync_threads": 4096,
    "max_jobs": 2**63 - 1,
    "processes": 1024,
    "process_memory_mb": 2**30,
    "max_stalled_attempts": U32_MAX,
}


def _seconds(name: str, value: Any, *, zero: bool) -> None:
    """A finite number of seconds up to ``MAX_MS``, above 0 (or from 0, with ``zero``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_MS / 1000:
        raise ConfigError(f"{name} must be a finite number of seconds from 0 to {MAX_MS // 1000:,}, got {value!r}")
    if value == 0 and not zero:
        raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")


_OPTION_FIELDS = {
    "concurrency",
    "max_attempts",
    "group",
    "consumer_id",
    "read_block_ms",
    "read_count",
    "claim_min_idle_ms",
    "events_enabled",
    "delayed_enabled",
    "run_scheduler",
    "scheduler_tick_ms",
    "promoter_poll_ms",
    "store_results",
    "max_result_bytes",
    "result_ttl_ms",
    "failure_ttl_ms",
    "ack_batch",
    "ack_idle_ms",
    "shutdown_deadline_secs",
    "sync_threads",
    "max_jobs",
    "idle_exit_secs",
    "fail_log_burst",
    "fail_log_window_secs",
    "job_timeout_ms",
    "processes",
    "process_memory_mb",
    "stalled_detector_enabled",
    "max_stalled_attempts",
    "reconnect_max_attempts",
    "retry",
}
_QUEUE_FIELDS = {
    "max_payload_bytes": "max_payload_bytes",
    "dlq_max_stream_len": "dlq_max_len",
    "max_stream_len": "max_stream_len",
    "events_max_stream_len": "events_max_len",
    "results_max_len": "results_max_len",
    "failures_max_len": "failures_max_len",
}


_RATE_OPTIONS = ("rate_limit_max", "rate_limit_duration_ms", "rate_limit_group_key")
DEFAULT_RATE_WINDOW_MS = 1000


def _positive(name: str, value: Any, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ConfigError(f"{name} must be a positive int up to {most:,}, got {value!r}")
    return value


def rate_limit_of(options: dict[str, Any]) -> RateLimit | None:
    """chasquimq's ``rate_limit_max`` / ``rate_limit_duration_ms`` (default 1000 ms) as the
    queue's rate limit, shared by every worker (``Queue.set_rate_limit``); a
    ``rate_limit_group_key`` is refused (per-group limits: ``Queue.set_group_limits``)."""
    most, window, group_key = (options.get(k) for k in _RATE_OPTIONS)
    if group_key is not None:
        raise ConfigError(
            "rate_limit_group_key is not supported: set per-group limits with "
            "Queue.set_group_limits(max_jobs=, per_ms=, group=) and add jobs with group="
        )
    if most is None:
        if window is not None:
            raise ConfigError("rate_limit_duration_ms needs rate_limit_max (the jobs each window lets start)")
        return None
    per_ms = DEFAULT_RATE_WINDOW_MS if window is None else _positive("rate_limit_duration_ms", window, MAX_RATE_PER_MS)
    return RateLimit(_positive("rate_limit_max", most, MAX_RATE_JOBS), per_ms)


def options_to_fields(options: dict[str, Any]) -> dict[str, Any]:
    """chasquimq's keyword arguments (``None`` = default) onto ``WorkerSettings`` fields."""
    out: dict[str, Any] = {}
    queue: dict[str, Any] = {}
    rate = rate_limit_of(options)
    if rate is not None:
        out["rate_limit"] = rate
    for key, value in options.items():
        if value is None or key in _RATE_OPTIONS:
            continue
        if key == "result_ttl":
            secs = value.total_seconds() if isinstance(value, timedelta) else value
            _seconds("result_ttl", secs, zero=False)  # NaN raised ValueError; a str was repeated 1,000 times
            out["result_ttl_ms"] = max(1, int(secs * 1000))
        elif key in _QUEUE_FIELDS:
            queue[_QUEUE_FIELDS[key]] = value
        elif key in _OPTION_FIELDS:
            out[key] = value
        else:
            raise ConfigError(f"unknown Worker option {key!r}")
    if queue:
        out["queue"] = QueueSettings(**queue)
    return out
