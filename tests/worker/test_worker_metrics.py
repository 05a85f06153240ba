"""``/metrics`` and ``/healthz``: scraped from a real ``chasqui worker`` subprocess after known
traffic, plus the health verdicts and the optional import, in process."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest
import redis

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.errors import ConfigError
from airflow_provider_chasqui.worker.metrics import DepthSampler, MetricsServer, PrometheusMetrics
from engine_support import wait_until_sync
from worker_support import free_port, http_get, metric_value


pytestmark = pytest.mark.timeout(300)  # deadlines are generous: CI machines are shared


def _scrape(port: int) -> str:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return body


def test_metrics_after_known_traffic(start_worker, redis_url: str, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    port = free_port()
    q = SyncQueue(queue_name, redis_url=redis_url)
    q.add_bulk([{"name": "echo", "data": i} for i in range(6)])
    q.add_bulk([{"name": "fail", "data": i, "attempts": 1} for i in range(2)])      # dead at once
    q.add("fail", "twice", attempts=2, backoff=50)                                  # retried once, then dead
    q.add("no_such_job", 1)                                                         # no handler
    q.add("echo", "much later", delay=3_600_000)
    q.add("echo", "later still", delay=7_200_000)
    with redis.Redis.from_url(redis_url) as r:
        r.xadd(keys.stream, {"x": "not a chasqui entry"})                           # malformed
    proc = start_worker(["-q", queue_name, "-H", "worker_handlers", "--redis-url", redis_url, "--no-scheduler",
                         "--metrics-port", str(port), "--metrics-host", "127.0.0.1", "--metrics-interval", "0.2"])
    proc.wait_for_log(f"/metrics")
    labels = {"queue": queue_name}

    def settled() -> str | None:
        text = _scrape(port)
        done = metric_value(text, "chasqui_jobs_completed_total", **labels, name="echo") == 6
        dead = metric_value(text, "chasqui_jobs_dead_lettered_total", **labels, name="fail",
                            reason="retries_exhausted") == 3
        dlq = metric_value(text, "chasqui_dlq_length", **labels) == 5
        return text if done and dead and dlq else None

    text = wait_until_sync(settled, 120, what="the worker to finish the seeded jobs", interval=0.05)
    expect = {
        ("chasqui_jobs_completed_total", (("name", "echo"),)): 6,
        ("chasqui_handler_duration_seconds_count", (("name", "echo"),)): 6,
        ("chasqui_jobs_failed_total", (("name", "fail"),)): 4,
        ("chasqui_jobs_retried_total", (("name", "fail"),)): 1,
        ("chasqui_jobs_dead_lettered_total", (("name", "fail"), ("reason", "retries_exhausted"))): 3,
        ("chasqui_jobs_dead_lettered_total", (("name", "__unregistered__"), ("reason", "unrecoverable"))): 1,
        ("chasqui_jobs_dead_lettered_total", (("name", ""), ("reason", "malformed"))): 1,
        ("chasqui_jobs_failed_total", (("name", "__unregistered__"),)): 1,
        ("chasqui_stream_length", ()): 0,
        ("chasqui_pending_jobs", (("group", "default"),)): 0,
        ("chasqui_delayed_jobs", ()): 2,
        ("chasqui_dlq_length", ()): 5,
        ("chasqui_promoter_promoted_total", ()): 1,
    }
    got = {key: metric_value(text, key[0], **labels, **dict(key[1])) for key in expect}
    assert got == expect
    assert metric_value(text, "chasqui_jobs_read_total", **labels) == 11  # 6 + 2 + 2 runs of "twice" + 1 unknown
    assert metric_value(text, "chasqui_promoter_lag_seconds", **labels) is not None
    assert metric_value(text, "chasqui_depth_sample_timestamp_seconds", **labels) > time.time() - 60
    assert metric_value(text, "chasqui_handler_duration_seconds_bucket", **labels, name="echo", le="+Inf") == 6

    status, body = http_get(f"http://127.0.0.1:{port}/healthz")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok", body
    assert health["checks"] == {"worker_running": True, "event_loop": True, "redis": True}
    assert health["queue"] == queue_name and health["handlers"] == ["echo", "fail", "hold", "slow_async"]
    assert http_get(f"http://127.0.0.1:{port}/nope")[0] == 404

    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(180) == 0, proc.output()
    q.close()


def test_scheduler_fires_are_counted(start_worker, redis_url: str, queue_name: str) -> None:
    from airflow_provider_chasqui.core.repeat import RepeatPattern

    port = free_port()
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.upsert_repeatable_job("echo", {"tick": True}, repeat=RepeatPattern.every(200), limit=3)
        proc = start_worker(["-q", queue_name, "-H", "worker_handlers", "--redis-url", redis_url,
                             "--metrics-port", str(port), "--metrics-host", "127.0.0.1"])
        proc.wait_for_log("/metrics")
        labels = {"queue": queue_name}

        def fired() -> str | None:
            text = _scrape(port)
            return text if metric_value(text, "chasqui_jobs_completed_total", **labels, name="echo") == 3 else None

        text = wait_until_sync(fired, 120, what="three fired jobs completed", interval=0.05)
    assert metric_value(text, "chasqui_scheduler_fires_total", **labels) == 3
    assert metric_value(text, "chasqui_scheduler_fire_lag_seconds_count", **labels) >= 1
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(180) == 0, proc.output()


# ---- in process --------------------------------------------------------------------------
def test_health_verdicts(redis_url: str, queue_name: str) -> None:
    sink = PrometheusMetrics(known_names=["a"])
    running = {"yes": False}
    server = MetricsServer(sink, port=0, host="127.0.0.1", sampler=DepthSampler(redis_url, queue_name),
                           interval=60, stale_after=0.5, is_running=lambda: running["yes"], queue=queue_name).start()
    try:
        url = f"http://127.0.0.1:{server.port}/healthz"
        status, body = http_get(url)
        assert status == 503 and json.loads(body)["checks"]["worker_running"] is False  # not started yet
        running["yes"] = True
        server.beat()
        assert http_get(url)[0] == 200
        wait_until_sync(lambda: http_get(url)[0] == 503, 120, what="the loop heartbeat to go stale")
        assert json.loads(http_get(url)[1])["checks"]["event_loop"] is False
        text = _scrape(server.port)
        assert metric_value(text, "chasqui_stream_length", queue=queue_name) == 0  # no stream yet: 0, no error
    finally:
        server.stop()


def test_unreachable_redis_fails_health_and_counts(queue_name: str) -> None:
    sink = PrometheusMetrics()
    dead = f"redis://127.0.0.1:{free_port()}/0"
    server = MetricsServer(sink, port=0, host="127.0.0.1", sampler=DepthSampler(dead, queue_name), interval=60,
                           queue=queue_name).start()
    try:
        status, body = http_get(f"http://127.0.0.1:{server.port}/healthz")
        info = json.loads(body)
        assert status == 503 and info["checks"]["redis"] is False and "redis_error" in info
        assert metric_value(_scrape(server.port), "chasqui_depth_sample_errors_total", queue=queue_name) == 1
    finally:
        server.stop()


def test_unregistered_names_share_one_label() -> None:
    sink = PrometheusMetrics(known_names=["known"])
    for name in ("known", "evil-1", "evil-2"):
        sink.job_dead("q", name, "unrecoverable")
    text = sink.exposition()[0].decode()
    assert metric_value(text, "chasqui_jobs_dead_lettered_total", queue="q", name="known", reason="unrecoverable") == 1
    assert metric_value(text, "chasqui_jobs_dead_lettered_total", queue="q", name="__unregistered__",
                        reason="unrecoverable") == 2


def test_prometheus_client_is_optional(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(ConfigError, match=r"pip install 'airflow-provider-chasqui\[metrics\]'"):
        PrometheusMetrics()


def test_metrics_port_without_prometheus_client_exits_2(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    import subprocess

    from worker_support import chasqui_command, subprocess_env

    blocker = tmp_path / "prometheus_client.py"
    blocker.write_text("raise ImportError('prometheus_client is not installed (test)')\n")
    env = subprocess_env()
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    proc = subprocess.run([*chasqui_command(), "worker", "-q", queue_name, "-H", "worker_handlers", "--redis-url",
                           redis_url, "--metrics-port", "0"], env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and "airflow-provider-chasqui[metrics]" in proc.stderr, proc.stderr


def test_metrics_port_in_use_exits_2(redis_url: str, queue_name: str) -> None:
    import socket
    import subprocess

    from worker_support import chasqui_command, subprocess_env

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([*chasqui_command(), "worker", "-q", queue_name, "-H", "worker_handlers", "--redis-url",
                               redis_url, "--metrics-port", str(port), "--metrics-host", "127.0.0.1"],
                              env=subprocess_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and f"cannot serve metrics on 127.0.0.1:{port}" in proc.stderr, proc.stderr
