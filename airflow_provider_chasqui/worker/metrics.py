"""Prometheus metrics for a worker process: a metrics sink and a depth sampler.

* :class:`PrometheusMetrics` is the ``metrics=`` object ``Worker`` (and its promoter and
  scheduler) call: jobs completed / failed / retried / dead-lettered by job name (and DLQ
  reason), handler latency, jobs read, promoter lag, scheduler fires and fire lag, lease
  renewals and lost leases, supervised-task restarts.
* :class:`DepthSampler` reads the queue's state (stream XLEN, pending count of the group,
  delayed ZCARD and how many of those are overdue, DLQ XLEN, the age of the oldest job not
  yet delivered, the group's consumers and their longest idle time, quarantined repeatable
  specs) with its own blocking driver, for any URL the engine takes (``redis://``,
  ``rediss://``, ``redis+sentinel://``, ``?cluster=true``).

Every metric, with a suggested alert, is listed in ``docs/metrics.md``.  The server that
exposes them with the health probes is :class:`~.metrics_server.MetricsServer` (re-exported
here).

``prometheus_client`` is an optional dependency (the ``metrics`` extra), imported only when a
:class:`PrometheusMetrics` is built.  Imports neither airflow nor pyspark.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..core.calls import Flow
from ..core.inspect import QueueSnapshot, snapshot
from ..core.keys import QueueKeys
from ..errors import ConfigError
from .metrics_server import MetricsServer

if TYPE_CHECKING:
    from ..sync import SyncDriver

__all__ = [
    "PrometheusMetrics",
    "DepthSampler",
    "MetricsServer",
    "UNREGISTERED",
    "LATENCY_BUCKETS",
    "DLQ_REASONS",
    "TASK_ROLES",
]

#: Label used for job names no handler is registered for (bounded label cardinality:
#: producers, not the operator, choose job names).
UNREGISTERED = "__unregistered__"
#: Handler latency buckets (seconds): 1 ms for plain handlers up to 4 h for Spark jobs.
LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
    7200.0,
    14400.0,
    float("inf"),
)
#: DLQ reasons a label may take (ChasquiMQ's five and ours); anything else is counted as ``other``.
DLQ_REASONS = frozenset(
    {
        "retries_exhausted",
        "unrecoverable",
        "decode_failed",
        "oversize_payload",
        "malformed",
        "routing_failed",
        "stalled",
    }
)
#: The worker's supervised task roles (the ``task`` label of ``chasqui_task_restarts_total``).
TASK_ROLES = ("reader", "slots", "flusher", "lease", "promoter", "scheduler")


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigError("metrics need prometheus-client: pip install 'airflow-provider-chasqui[metrics]'") from exc
    return prometheus_client


class PrometheusMetrics:
    """The worker's metrics sink, backed by prometheus_client.

    Every metric lives in this object's own ``CollectorRegistry`` (``registry``), so several
    workers in one process (tests) never collide.  ``known_names``: the job names with a
    registered handler; other names are counted under :data:`UNREGISTERED`.  Called from the
    worker's event loop and the sampler thread; prometheus_client metrics are thread-safe.
    """

    def __init__(
        self, *, known_names: Iterable[str] | None = None, registry: Any = None, namespace: str = "chasqui"
    ) -> None:
        pc = _prometheus()
        self.registry = registry if registry is not None else pc.CollectorRegistry(auto_describe=True)
        self._known = None if known_names is None else frozenset(known_names)
        r, ns = self.registry, namespace
        self.completed = pc.Counter(
            "jobs_completed", "Jobs whose handler returned", ["queue", "name"], namespace=ns, registry=r
        )
        self.failed = pc.Counter(
            "jobs_failed",
            "Handler runs that raised (retried or dead-lettered)",
            ["queue", "name"],
            namespace=ns,
            registry=r,
        )
        self.retried = pc.Counter(
            "jobs_retried", "Failed runs scheduled for another attempt", ["queue", "name"], namespace=ns, registry=r
        )
        self.dead = pc.Counter(
            "jobs_dead_lettered",
            "Jobs moved to the dead-letter queue",
            ["queue", "name", "reason"],
            namespace=ns,
            registry=r,
        )
        self.latency = pc.Histogram(
            "handler_duration_seconds",
            "Run time of handlers that returned",
            ["queue", "name"],
            namespace=ns,
            registry=r,
            buckets=LATENCY_BUCKETS,
        )
        self.read = pc.Counter(
            "jobs_read", "Jobs read from the stream and handed to handlers", ["queue"], namespace=ns, registry=r
        )
        self.batches = pc.Counter("read_batches", "Non-empty stream reads", ["queue"], namespace=ns, registry=r)
        self.promoted = pc.Counter(
            "promoter_promoted",
            "Delayed jobs moved to the stream by this process's promoter",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.promoter_lag = pc.Gauge(
            "promoter_lag_seconds",
            "How overdue the oldest due delayed job was at the promoter's last tick",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.fires = pc.Counter(
            "scheduler_fires",
            "Repeatable-job fires enqueued by this process's scheduler",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.fire_lag = pc.Histogram(
            "scheduler_fire_lag_seconds",
            "Delay between a fire's due time and its enqueue",
            ["queue"],
            namespace=ns,
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf")),
        )
        self.stream_depth = pc.Gauge(
            "stream_length", "Entries in the queue's stream (XLEN)", ["queue"], namespace=ns, registry=r
        )
        self.pending_depth = pc.Gauge(
            "pending_jobs",
            "Entries read but not yet acknowledged (XPENDING)",
            ["queue", "group"],
            namespace=ns,
            registry=r,
        )
        self.delayed_depth = pc.Gauge(
            "delayed_jobs", "Jobs waiting in the delayed set (ZCARD)", ["queue"], namespace=ns, registry=r
        )
        self.dlq_depth = pc.Gauge(
            "dlq_length", "Entries in the dead-letter stream (XLEN)", ["queue"], namespace=ns, registry=r
        )
        self.sample_time = pc.Gauge(
            "depth_sample_timestamp_seconds",
            "Unix time of the last successful depth sample",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.sample_errors = pc.Counter(
            "depth_sample_errors",
            "Depth samples that failed (Redis unreachable, ...)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.oldest_waiting = pc.Gauge(
            "oldest_waiting_job_age_seconds",
            "Age of the oldest job in the stream not yet delivered to a worker (0: none waiting)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.delayed_overdue = pc.Gauge(
            "delayed_overdue_jobs",
            "Delayed jobs whose run time has passed but are "
            "still in the delayed set (the promoter is behind or not running)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.consumers = pc.Gauge(
            "consumers", "Consumers of the group (XINFO CONSUMERS)", ["queue", "group"], namespace=ns, registry=r
        )
        self.consumer_idle = pc.Gauge(
            "consumer_max_idle_seconds",
            "Longest idle time among the group's consumers "
            "(a dead worker's consumer grows until the janitor removes it)",
            ["queue", "group"],
            namespace=ns,
            registry=r,
        )
        self.quarantined = pc.Gauge(
            "scheduler_quarantined_specs",
            "Repeatable specs moved to quarantine because they could not be decoded (they no longer fire)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.lease_renewals = pc.Counter(
            "lease_renewals", "In-flight entries whose lease this worker renewed", ["queue"], namespace=ns, registry=r
        )
        self.leases_lost = pc.Counter(
            "leases_lost",
            "In-flight entries another consumer took over (this worker was paused or cut off longer than the lease)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.stalled = pc.Counter(
            "jobs_stalled",
            "Jobs this worker took over from a consumer that stopped renewing them (a dead or frozen worker)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.held = pc.Gauge(
            "jobs_held_back",
            "Jobs this worker read but may not start yet: the queue is paused, at its concurrency or rate "
            "limit, or blocked by a handler's RateLimited",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.prioritized = pc.Gauge(
            "prioritized_jobs",
            "Jobs added with a priority, waiting to enter the stream (ZCARD of the prioritized set)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.job_groups = pc.Gauge(
            "job_groups_waiting",
            "Job groups (tenants) with waiting jobs, taking turns (ZCARD of the groups' turn)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        # the next JOB_GROUP_ROWS groups in turn (core/inspect.py): bounded label values
        self.group_waiting = pc.Gauge(
            "group_jobs_waiting",
            "Waiting jobs of each job group (tenant) next in turn, the first 10 in turn order",
            ["queue", "job_group"],
            namespace=ns,
            registry=r,
        )
        self.group_running = pc.Gauge(
            "group_jobs_running",
            "Running jobs of each job group (tenant) next in turn, under its concurrency limit",
            ["queue", "job_group"],
            namespace=ns,
            registry=r,
        )
        self._groups_shown: dict[str, set[str]] = {}
        self.queue_paused = pc.Gauge(
            "queue_paused", "1 while the queue is paused (Queue.pause())", ["queue"], namespace=ns, registry=r
        )
        self.slots_held = pc.Gauge(
            "concurrency_slots_held",
            "Jobs of the queue running under its concurrency limit, all workers together",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.concurrency_limit = pc.Gauge(
            "concurrency_limit",
            "The queue's concurrency limit (Queue.set_concurrency(); 0: none)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.left_running = pc.Gauge(
            "handlers_left_running",
            "Handlers still running whose job was ended without them (a timeout or cancel they ignored, "
            "or a plain handler's thread that cannot be stopped)",
            ["queue"],
            namespace=ns,
            registry=r,
        )
        self.restarts = pc.Counter(
            "task_restarts",
            "Restarts of the worker's supervised tasks after a crash",
            ["queue", "task"],
            namespace=ns,
            registry=r,
        )

    def _name(self, name: str) -> str:
        if self._known is None or name in self._known or name == "":
            return name
        return UNREGISTERED

    # ---- the Worker's sink protocol --------------------------------------------------------
    def batch(self, queue: str, n: int) -> None:
        self.batches.labels(queue).inc()
        self.read.labels(queue).inc(n)

    def job_completed(self, queue: str, name: str, seconds: float) -> None:
        label = self._name(name)
        self.completed.labels(queue, label).inc()
        self.latency.labels(queue, label).observe(seconds)

    def job_failed(self, queue: str, name: str) -> None:
        self.failed.labels(queue, self._name(name)).inc()

    def job_retried(self, queue: str, name: str) -> None:
        self.retried.labels(queue, self._name(name)).inc()

    def job_dead(self, queue: str, name: str, reason: str) -> None:
        self.dead.labels(queue, self._name(name), reason if reason in DLQ_REASONS else "other").inc()

    def lease_renewed(self, queue: str, entries: int) -> None:
        self.lease_renewals.labels(queue).inc(entries)

    def lease_lost(self, queue: str, entries: int) -> None:
        self.leases_lost.labels(queue).inc(entries)

    def jobs_stalled(self, queue: str, n: int) -> None:
        self.stalled.labels(queue).inc(n)

    def task_restarted(self, queue: str, task: str, n: int = 1) -> None:
        """``n=0`` when the task starts: the series exists (at 0) before the first restart."""
        self.restarts.labels(queue, task if task in TASK_ROLES else "other").inc(n)

    def promoter_tick(self, queue: str, promoted: int, depth: int, lag_ms: int) -> None:
        if promoted:
            self.promoted.labels(queue).inc(promoted)
        self.promoter_lag.labels(queue).set(lag_ms / 1000)
        self.delayed_depth.labels(queue).set(depth)

    def jobs_held(self, queue: str, n: int) -> None:
        self.held.labels(queue).set(n)

    def handlers_left_running(self, queue: str, n: int) -> None:
        self.left_running.labels(queue).set(n)

    def scheduler_fire(self, queue: str, fires: int, lag_ms: int) -> None:
        if fires:
            self.fires.labels(queue).inc(fires)
            self.fire_lag.labels(queue).observe(max(0, lag_ms) / 1000)

    # ---- depths ----------------------------------------------------------------------------
    def set_depths(self, queue: str, group: str, depths: dict[str, Any]) -> None:
        self.stream_depth.labels(queue).set(depths["stream"])
        self.pending_depth.labels(queue, group).set(depths["pending"])
        self.delayed_depth.labels(queue).set(depths["delayed"])
        self.dlq_depth.labels(queue).set(depths["dlq"])
        if "oldest_waiting_ms" in depths:  # the DepthSampler's extras (a custom sampler may not have them)
            self.oldest_waiting.labels(queue).set(depths["oldest_waiting_ms"] / 1000)
            self.delayed_overdue.labels(queue).set(depths["overdue"])
            self.consumers.labels(queue, group).set(depths["consumers"])
            self.consumer_idle.labels(queue, group).set(depths["consumer_max_idle_ms"] / 1000)
            self.quarantined.labels(queue).set(depths["quarantined"])
            self.queue_paused.labels(queue).set(depths["paused"])
            self.prioritized.labels(queue).set(depths["prioritized"])
            self.job_groups.labels(queue).set(depths["job_groups"])
            self.slots_held.labels(queue).set(depths["slots_held"])
            self.concurrency_limit.labels(queue).set(depths["concurrency"])
        if "job_group_rows" in depths:
            self._set_groups(queue, depths["job_group_rows"])
        self.sample_time.labels(queue).set(time.time())

    def _set_groups(self, queue: str, rows: list[tuple[str, int, int]]) -> None:
        """Per-group gauges for the groups next in turn; a group no longer among them loses its
        series (so the label values stay as few as the rows)."""
        shown = set()
        for name, waiting, running in rows:
            self.group_waiting.labels(queue, name).set(waiting)
            self.group_running.labels(queue, name).set(running)
            shown.add(name)
        for gone in self._groups_shown.get(queue, set()) - shown:
            for gauge in (self.group_waiting, self.group_running):
                with contextlib.suppress(KeyError):
                    gauge.remove(queue, gone)
        self._groups_shown[queue] = shown

    def sample_failed(self, queue: str) -> None:
        self.sample_errors.labels(queue).inc()

    def exposition(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the Prometheus text format."""
        pc = _prometheus()
        return pc.generate_latest(self.registry), pc.CONTENT_TYPE_LATEST


class DepthSampler:
    """Reads a queue's depths and ages on a blocking driver of its own (any URL the engine takes).

    A missing stream or group counts as 0 (a worker that has not created its group yet).
    Ages use this machine's clock against stream ids and delayed scores (Redis' and the
    producers' clocks): keep clocks in sync (NTP), as the scheduler already needs.
    Used from the :class:`MetricsServer` thread only.
    """

    def __init__(self, redis_url: str, queue: str, *, group: str = "default") -> None:
        self.keys = QueueKeys.for_queue(queue)
        self.group = group
        self._url = redis_url
        self._driver: SyncDriver | None = None  # made on first use: a cluster client connects when it is built

    def _flow(self, now_ms: int) -> Flow[dict[str, Any]]:
        """The gauges' values, read through ``core.inspect.snapshot`` (what ``chasqui inspect``
        and the dashboard show, so the three agree)."""
        s: QueueSnapshot = yield from snapshot(self.keys.queue, group=self.group, now_ms=now_ms, next_fires=1)
        return {
            "stream": s.stream,
            "pending": s.pending,
            "delayed": s.delayed,
            "dlq": s.dlq,
            "oldest_waiting_ms": s.oldest_waiting_ms or 0,
            "overdue": s.overdue,
            "consumers": s.live_consumers,
            "consumer_max_idle_ms": s.consumer_max_idle_ms,
            "quarantined": s.quarantined,
            "paused": int(s.paused),
            "prioritized": s.prioritized,
            "job_groups": s.job_groups,
            "slots_held": s.slots_held,
            "concurrency": s.concurrency or 0,
            "job_group_rows": list(s.job_group_rows),
        }

    def sample(self) -> dict[str, Any]:
        if self._driver is None:
            from ..sync import SyncDriver

            self._driver = SyncDriver(self._url, lane=False, socket_connect_timeout=2, socket_timeout=5)
        return self._driver.run(self._flow(int(time.time() * 1000)))

    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()
