"""The HTTP face of a worker's metrics: ``/metrics`` (Prometheus text format), ``/livez`` (the
process and its event loop answer), ``/readyz`` (the worker runs and Redis answered the last
depth sample; ``/healthz`` is an alias) from daemon threads, and the sampler run every
``interval`` seconds, so a scrape never waits on Redis.

The HTTP side (``worker/http_server.py``) is small on purpose, because nothing authenticates
it: it binds 127.0.0.1 unless told otherwise; one selector thread reads request heads (at most
8 KiB, within ``header_timeout`` seconds, at most ``max_connections`` open: the oldest is
dropped for a new one), so idle or slow clients hold no thread; a fixed pool of ``workers``
threads answers complete GET requests with ``Connection: close``.  Health bodies are
``{"status", "checks"}`` only: error texts go to the log, never to the body.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from .http_server import HttpServer

if TYPE_CHECKING:
    from .metrics import DepthSampler, PrometheusMetrics

__all__ = ["MetricsServer"]

log = logging.getLogger("airflow_provider_chasqui.worker.metrics")  # the logger its lines always had

_SUMMARY_KEYS = frozenset({"ok", "running", "left_running"})  # not tasks: handlers left running do not kill it
_STUCK = ("restarting", "stalled", "renewal late")


class MetricsServer:
    """``/metrics``, ``/livez``, ``/readyz`` and ``/healthz`` on ``host:port`` (port 0 = any
    free port, see :attr:`port`).

    ``/livez`` answers 200 while the process serves and the worker's event loop (given with
    :meth:`attach_loop`) runs a callback within ``loop_deadline`` seconds, and every task the
    worker's ``health()`` reports (when it has one) is alive; otherwise 503.  A Redis outage
    does not fail it, so Kubernetes does not restart every pod when Redis goes away.
    ``/readyz`` (and ``/healthz``) answers 200 when the worker reports running
    (``is_running``) and the last depth sample reached Redis.  Start with :meth:`start`, stop
    with :meth:`stop`; every thread is a daemon, so a crashing worker never hangs on them.
    """

    def __init__(
        self,
        metrics: PrometheusMetrics,
        *,
        port: int,
        host: str = "127.0.0.1",
        sampler: DepthSampler | None = None,
        interval: float = 5.0,
        loop_deadline: float = 5.0,
        is_running: Callable[[], bool] | None = None,
        health: Callable[[], Any] | None = None,
        queue: str = "",
        header_timeout: float = 5.0,
        max_connections: int = 64,
        workers: int = 4,
    ) -> None:
        for name, value in (
            ("metrics interval", interval),
            ("loop_deadline", loop_deadline),
            ("header_timeout", header_timeout),
        ):
            if not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        self.metrics = metrics
        self.sampler = sampler
        self.interval = interval
        self.loop_deadline = loop_deadline
        self.is_running = is_running or (lambda: True)
        self.health_source = health
        self.queue = queue
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sample_ok: bool | None = None
        self._stop = threading.Event()
        self._http = HttpServer(
            host, port, self._respond, header_timeout=header_timeout, max_connections=max_connections, workers=workers
        )
        self._threads: list[threading.Thread] = []

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def host(self) -> str:
        return self._http.host

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker's event loop, which ``/livez`` asks to run a callback."""
        self._loop = loop

    def start(self) -> MetricsServer:
        self._threads.extend(self._http.start())
        if self.sampler is not None:
            self.sample_now()
            sample = threading.Thread(target=self._sample_loop, name="chasqui-metrics-sampler", daemon=True)
            sample.start()
            self._threads.append(sample)
        log.info(
            "metrics for queue %s on http://%s:%d/metrics (probes: /livez, /readyz)", self.queue, self.host, self.port
        )
        return self

    def stop(self) -> None:
        self._stop.set()
        self._http.stop()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.sampler is not None:
            self.sampler.close()

    def sample_now(self) -> None:
        assert self.sampler is not None
        try:
            depths = self.sampler.sample()
        except Exception as exc:  # noqa: BLE001 - any failure (redis, cluster, OS) means "not ready", logged
            self._sample_ok = False
            self.metrics.sample_failed(self.queue)
            log.warning("queue %s: depth sample failed: %s", self.queue, exc)
            return
        self.metrics.set_depths(self.queue, self.sampler.group, depths)
        self._sample_ok = True

    def _sample_loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample_now()

    # ---- probes ----------------------------------------------------------------------------
    def _loop_answers(self) -> bool:
        loop = self._loop
        if loop is None:
            return True  # not attached (the worker is starting, or a server without a worker)
        answered = threading.Event()
        try:
            loop.call_soon_threadsafe(answered.set)
        except RuntimeError:  # the loop is closed
            return False
        return answered.wait(self.loop_deadline)

    def _tasks_alive(self) -> bool:
        """False when the worker's ``health()`` names a dead task (``{task: False}``,
        ``{task: {"alive": False}}``, or, while Redis answers, a task ``"restarting: ..."``,
        ``"stalled ..."`` or ``"renewal late ..."``); a ``health()`` that raises counts as dead."""
        if self.health_source is None:
            return True
        try:
            report = self.health_source()
        except Exception:  # a broken health report is a failed probe, logged
            log.exception("queue %s: the worker's health() failed", self.queue)
            return False
        redis_up = self._sample_ok is not False
        for task, state in dict(report or {}).items():
            if task in _SUMMARY_KEYS:  # Worker.health()'s summary: judged task by task below
                continue
            alive = state.get("alive", state.get("ok", True)) if isinstance(state, dict) else state
            # A stalled reader, a late lease renewal or a task in its restart backoff is dead only
            # while Redis answers: during an outage they wait for Redis, and a restart would not help.
            if alive is False or (redis_up and isinstance(alive, str) and alive.startswith(_STUCK)):
                log.warning("queue %s: worker task %s is not alive: %s", self.queue, task, state)
                return False
        return True

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        checks = {"event_loop": self._loop_answers(), "tasks": self._tasks_alive()}
        return all(checks.values()), {"status": "ok" if all(checks.values()) else "fail", "checks": checks}

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        checks = {"worker_running": bool(self.is_running()), "redis": self._sample_ok is not False}
        return all(checks.values()), {"status": "ok" if all(checks.values()) else "fail", "checks": checks}

    def _respond(self, path: str) -> tuple[int, bytes, str]:
        if path == "/metrics":
            body, ctype = self.metrics.exposition()
            return 200, body, ctype
        probe = {"/livez": self.liveness, "/readyz": self.readiness, "/healthz": self.readiness}.get(path)
        if probe is None:
            return 404, b"not found\n", "text/plain; charset=utf-8"
        ok, report = probe()
        return (200 if ok else 503), json.dumps(report).encode(), "application/json"
