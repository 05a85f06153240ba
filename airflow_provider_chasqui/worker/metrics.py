"""Prometheus metrics and health for a worker process: a metrics sink, a depth sampler, an HTTP server.

* :class:`PrometheusMetrics` is the ``metrics=`` object ``Worker`` (and its promoter and
  scheduler) call: jobs completed / failed / retried / dead-lettered by job name, handler
  latency, jobs read, promoter lag, scheduler fires and fire lag.
* :class:`DepthSampler` reads the queue's depths (stream XLEN, pending count from XPENDING,
  delayed ZCARD, DLQ XLEN) in one pipelined round trip with its own blocking connection.
* :class:`MetricsServer` serves ``/metrics`` (Prometheus text format) and ``/healthz`` (JSON;
  200 or 503) from a daemon thread, and runs the sampler every ``interval`` seconds, so a
  scrape never waits on Redis and a stuck event loop still shows up (its heartbeat goes stale).

``prometheus_client`` is an optional dependency (the ``metrics`` extra), imported only when a
:class:`PrometheusMetrics` is built.  Imports neither airflow nor pyspark.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable

import redis

from ..core.keys import QueueKeys
from ..errors import ConfigError
from ..sync._sentinel import make_client

__all__ = ["PrometheusMetrics", "DepthSampler", "MetricsServer", "UNREGISTERED", "LATENCY_BUCKETS"]

log = logging.getLogger(__name__)

#: Label used for job names no handler is registered for (bounded label cardinality:
#: producers, not the operator, choose job names).
UNREGISTERED = "__unregistered__"
#: Handler latency buckets (seconds): milliseconds for plain handlers up to half an hour for Spark jobs.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                   600.0, 1800.0, float("inf"))


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

    def __init__(self, *, known_names: Iterable[str] | None = None, registry: Any = None,
                 namespace: str = "chasqui") -> None:
        pc = _prometheus()
        self.registry = registry if registry is not None else pc.CollectorRegistry(auto_describe=True)
        self._known = None if known_names is None else frozenset(known_names)
        r, ns = self.registry, namespace
        self.completed = pc.Counter("jobs_completed", "Jobs whose handler returned", ["queue", "name"],
                                    namespace=ns, registry=r)
        self.failed = pc.Counter("jobs_failed", "Handler runs that raised (retried or dead-lettered)",
                                 ["queue", "name"], namespace=ns, registry=r)
        self.retried = pc.Counter("jobs_retried", "Failed runs scheduled for another attempt", ["queue", "name"],
                                  namespace=ns, registry=r)
        self.dead = pc.Counter("jobs_dead_lettered", "Jobs moved to the dead-letter queue", ["queue", "name", "reason"],
                               namespace=ns, registry=r)
        self.latency = pc.Histogram("handler_duration_seconds", "Run time of handlers that returned",
                                    ["queue", "name"], namespace=ns, registry=r, buckets=LATENCY_BUCKETS)
        self.read = pc.Counter("jobs_read", "Jobs read from the stream and handed to handlers", ["queue"],
                               namespace=ns, registry=r)
        self.batches = pc.Counter("read_batches", "Non-empty stream reads", ["queue"], namespace=ns, registry=r)
        self.promoted = pc.Counter("promoter_promoted", "Delayed jobs moved to the stream by this process's promoter",
                                   ["queue"], namespace=ns, registry=r)
        self.promoter_lag = pc.Gauge("promoter_lag_seconds", "How overdue the oldest due delayed job was at the "
                                     "promoter's last tick", ["queue"], namespace=ns, registry=r)
        self.fires = pc.Counter("scheduler_fires", "Repeatable-job fires enqueued by this process's scheduler",
                                ["queue"], namespace=ns, registry=r)
        self.fire_lag = pc.Histogram("scheduler_fire_lag_seconds", "Delay between a fire's due time and its enqueue",
                                     ["queue"], namespace=ns, registry=r,
                                     buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, float("inf")))
        self.stream_depth = pc.Gauge("stream_length", "Entries in the queue's stream (XLEN)", ["queue"],
                                     namespace=ns, registry=r)
        self.pending_depth = pc.Gauge("pending_jobs", "Entries read but not yet acknowledged (XPENDING)",
                                      ["queue", "group"], namespace=ns, registry=r)
        self.delayed_depth = pc.Gauge("delayed_jobs", "Jobs waiting in the delayed set (ZCARD)", ["queue"],
                                      namespace=ns, registry=r)
        self.dlq_depth = pc.Gauge("dlq_length", "Entries in the dead-letter stream (XLEN)", ["queue"],
                                  namespace=ns, registry=r)
        self.sample_time = pc.Gauge("depth_sample_timestamp_seconds", "Unix time of the last successful depth sample",
                                    ["queue"], namespace=ns, registry=r)
        self.sample_errors = pc.Counter("depth_sample_errors", "Depth samples that failed (Redis unreachable, ...)",
                                        ["queue"], namespace=ns, registry=r)

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
        self.dead.labels(queue, self._name(name), reason).inc()

    def promoter_tick(self, queue: str, promoted: int, depth: int, lag_ms: int) -> None:
        if promoted:
            self.promoted.labels(queue).inc(promoted)
        self.promoter_lag.labels(queue).set(lag_ms / 1000)
        self.delayed_depth.labels(queue).set(depth)

    def scheduler_fire(self, queue: str, fires: int, lag_ms: int) -> None:
        if fires:
            self.fires.labels(queue).inc(fires)
            self.fire_lag.labels(queue).observe(max(0, lag_ms) / 1000)

    # ---- depths ----------------------------------------------------------------------------
    def set_depths(self, queue: str, group: str, depths: dict[str, int]) -> None:
        self.stream_depth.labels(queue).set(depths["stream"])
        self.pending_depth.labels(queue, group).set(depths["pending"])
        self.delayed_depth.labels(queue).set(depths["delayed"])
        self.dlq_depth.labels(queue).set(depths["dlq"])
        self.sample_time.labels(queue).set(time.time())

    def sample_failed(self, queue: str) -> None:
        self.sample_errors.labels(queue).inc()

    def exposition(self) -> tuple[bytes, str]:
        """``(body, content type)`` of the Prometheus text format."""
        pc = _prometheus()
        return pc.generate_latest(self.registry), pc.CONTENT_TYPE_LATEST


class DepthSampler:
    """Reads a queue's four depths in one pipeline on a blocking connection of its own.

    A missing stream or group counts as 0 (a worker that has not created its group yet).
    Used from the :class:`MetricsServer` thread only.
    """

    def __init__(self, redis_url: str, queue: str, *, group: str = "default") -> None:
        self.keys = QueueKeys.for_queue(queue)
        self.group = group
        self._client = make_client(redis_url, socket_connect_timeout=2, socket_timeout=5)  # RESP2, TLS checks, ...

    def sample(self) -> dict[str, int]:
        k = self.keys
        pipe = self._client.pipeline(transaction=False)
        pipe.xlen(k.stream)
        pipe.execute_command("XPENDING", k.stream, self.group)
        pipe.zcard(k.delayed)
        pipe.xlen(k.dlq)
        stream, pending, delayed, dlq = pipe.execute(raise_on_error=False)
        for reply in (stream, delayed, dlq):
            if isinstance(reply, Exception):
                raise reply
        if isinstance(pending, redis.ResponseError) and "NOGROUP" in str(pending):
            pending_count = 0
        elif isinstance(pending, Exception):
            raise pending
        else:
            pending_count = int(pending[0] if isinstance(pending, (list, tuple)) else pending.get("pending", 0))
        return {"stream": int(stream), "pending": pending_count, "delayed": int(delayed), "dlq": int(dlq)}

    def close(self) -> None:
        self._client.close()


class MetricsServer:
    """``/metrics`` and ``/healthz`` on ``host:port`` (port 0 = any free port, see :attr:`port`).

    ``/healthz`` answers 200 when every check passes and 503 otherwise, with a JSON body:
    the worker reports running (``is_running``), its event loop beat within ``stale_after``
    seconds (:meth:`beat`, called from the loop), and the last depth sample succeeded.
    Start with :meth:`start`, stop with :meth:`stop`; the serving and sampling threads are
    daemons, so a crashing worker never hangs on them.
    """

    def __init__(self, metrics: PrometheusMetrics, *, port: int, host: str = "0.0.0.0",
                 sampler: DepthSampler | None = None, interval: float = 5.0, stale_after: float = 30.0,
                 is_running: Callable[[], bool] | None = None, queue: str = "", info: dict[str, Any] | None = None) -> None:
        if interval <= 0:
            raise ConfigError(f"metrics interval must be positive, got {interval!r}")
        self.metrics = metrics
        self.sampler = sampler
        self.interval = interval
        self.stale_after = stale_after
        self.is_running = is_running or (lambda: True)
        self.queue = queue
        self.info = dict(info or {})
        self._last_beat = time.monotonic()
        self._sample_ok: bool | None = None
        self._sample_error = ""
        self._stop = threading.Event()
        self._server = ThreadingHTTPServer((host, port), _handler_class(self))
        self._server.daemon_threads = True
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    def beat(self) -> None:
        """The worker's event loop is alive (thread-safe: a float store)."""
        self._last_beat = time.monotonic()

    def start(self) -> "MetricsServer":
        serve = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                 name="chasqui-metrics-http", daemon=True)
        serve.start()
        self._threads.append(serve)
        if self.sampler is not None:
            self.sample_now()
            sample = threading.Thread(target=self._sample_loop, name="chasqui-metrics-sampler", daemon=True)
            sample.start()
            self._threads.append(sample)
        log.info("metrics for queue %s on http://%s:%d/metrics (health: /healthz)", self.queue, self.host, self.port)
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.sampler is not None:
            self.sampler.close()

    def sample_now(self) -> None:
        assert self.sampler is not None
        try:
            depths = self.sampler.sample()
        except (redis.RedisError, OSError) as exc:
            self._sample_ok, self._sample_error = False, f"{type(exc).__name__}: {exc}"
            self.metrics.sample_failed(self.queue)
            log.warning("queue %s: depth sample failed: %s", self.queue, exc)
            return
        self.metrics.set_depths(self.queue, self.sampler.group, depths)
        self._sample_ok, self._sample_error = True, ""

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample_now()

    def health(self) -> tuple[bool, dict[str, Any]]:
        beat_age = time.monotonic() - self._last_beat
        checks = {
            "worker_running": bool(self.is_running()),
            "event_loop": beat_age <= self.stale_after,
            "redis": self._sample_ok is not False,
        }
        body: dict[str, Any] = {"status": "ok" if all(checks.values()) else "fail", "queue": self.queue,
                                "checks": checks, "loop_beat_age_s": round(beat_age, 3), **self.info}
        if self._sample_error:
            body["redis_error"] = self._sample_error
        return all(checks.values()), body


def _handler_class(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype = server.metrics.exposition()
                self._send(200, body, ctype)
            elif path in ("/healthz", "/health", "/livez"):
                ok, info = server.health()
                self._send(200 if ok else 503, json.dumps(info).encode(), "application/json")
            else:
                self._send(404, b"not found: try /metrics or /healthz\n", "text/plain")

        def _send(self, status: int, body: bytes, ctype: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug("metrics http: " + format, *args)

    return Handler
