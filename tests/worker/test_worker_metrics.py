"""``/metrics``, ``/livez``, ``/readyz`` (``/healthz``): scraped from real ``chasqui worker``
subprocesses (standalone, Sentinel and Cluster URLs; a Redis outage; a blocked event loop), plus
the probe verdicts, the HTTP limits (idle and slow clients on real sockets) and the optional
import, in process."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from engine_support import wait_until_sync
from fault_support import start_sentinel
from servers import binary_for, free_port, start_server
from worker_support import http_get, metric_value, subprocess_env

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.errors import ConfigError
from airflow_provider_chasqui.worker.metrics import DepthSampler, MetricsServer, PrometheusMetrics

READY = {"status": "ok", "checks": {"worker_running": True, "redis": True}}
LIVE = {"status": "ok", "checks": {"event_loop": True, "tasks": True}}


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
    q.add_bulk([{"name": "fail", "data": i, "attempts": 1} for i in range(2)])  # dead at once
    q.add("fail", "twice", attempts=2, backoff=50)  # retried once, then dead
    q.add("no_such_job", 1)  # no handler
    q.add("echo", "much later", delay=3_600_000)
    q.add("echo", "later still", delay=7_200_000)
    with redis.Redis.from_url(redis_url) as r:
        r.xadd(keys.stream, {"x": "not a chasqui entry"})  # malformed
    proc = start_worker(
        [
            "-q",
            queue_name,
            "-H",
            "worker_handlers",
            "--no-scheduler",
            "--metrics-port",
            str(port),
            "--metrics-interval",
            "0.2",
        ],
        env=subprocess_env(CHASQUI_REDIS_URL=redis_url),
    )
    proc.wait_for_log(f"on http://127.0.0.1:{port}/metrics")  # loopback unless --metrics-host says otherwise
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.2", port), timeout=5).close()
    labels = {"queue": queue_name}

    def settled() -> str | None:
        text = _scrape(port)
        done = metric_value(text, "chasqui_jobs_completed_total", **labels, name="echo") == 6
        dead = (
            metric_value(text, "chasqui_jobs_dead_lettered_total", **labels, name="fail", reason="retries_exhausted")
            == 3
        )
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

    for path, want in (("/readyz", READY), ("/healthz", READY), ("/livez", LIVE)):
        status, body = http_get(f"http://127.0.0.1:{port}{path}")
        assert (status, json.loads(body)) == (200, want), (path, body)  # no handler list, no queue, no errors
    assert http_get(f"http://127.0.0.1:{port}/nope") == (404, "not found\n")

    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(180) == 0, proc.output()
    q.close()


def test_scheduler_fires_are_counted(start_worker, redis_url: str, queue_name: str) -> None:
    from airflow_provider_chasqui.core.repeat import RepeatPattern

    port = free_port()
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.upsert_repeatable_job("echo", {"tick": True}, repeat=RepeatPattern.every(200), limit=3)
        proc = start_worker(
            [
                "-q",
                queue_name,
                "-H",
                "worker_handlers",
                "--redis-url",
                redis_url,
                "--metrics-port",
                str(port),
                "--metrics-host",
                "127.0.0.1",
            ]
        )
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


def _probe(port: int, path: str) -> tuple[int, dict]:
    status, body = http_get(f"http://127.0.0.1:{port}{path}", timeout=30)
    return status, json.loads(body)


def test_redis_outage_fails_readyz_but_not_livez(start_worker, tmp_path: Path, queue_name: str) -> None:
    """Kubernetes restarts pods on a failed liveness probe: a Redis outage must only fail readiness."""
    server = start_server("redis7", tmpdir=tmp_path)
    try:
        port = free_port()
        proc = start_worker(
            [
                "-q",
                queue_name,
                "-H",
                "worker_handlers",
                "--metrics-port",
                str(port),
                "--metrics-interval",
                "0.2",
                "--claim-min-idle-ms",
                "3000",
            ],
            env=subprocess_env(CHASQUI_REDIS_URL=server.url),
        )
        proc.wait_for_log("/metrics")
        wait_until_sync(lambda: _probe(port, "/readyz") == (200, READY), 120, what="ready")
        server.stop()
        outage = {"status": "fail", "checks": {"worker_running": True, "redis": False}}
        wait_until_sync(lambda: _probe(port, "/readyz") == (503, outage), 120, what="readyz to fail")
        assert _probe(port, "/healthz") == (503, outage)
        # Held past the lease (3 s: its renewal is late) and the reader's stall limit (read block
        # 5 s + 20 s): the worker's tasks wait for Redis, so liveness holds throughout.
        held_until = time.monotonic() + 32
        while time.monotonic() < held_until:
            assert _probe(port, "/livez") == (200, LIVE)
            time.sleep(1)
        server.start()
        wait_until_sync(lambda: _probe(port, "/readyz") == (200, READY), 120, what="ready again")
        with SyncQueue(queue_name, redis_url=server.url) as q:
            job = q.add("echo", "after the outage")
            assert q.wait_for_result(job.id, timeout=120) == {"echo": "after the outage"}
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit(180) == 0, proc.output()
        assert proc.output().count("depth sample failed") >= 1  # the error text goes to the log, not the body
    finally:
        server.stop()


BLOCKING_HANDLERS = """
import os, time
from airflow_provider_chasqui.worker import handler

@handler("block_loop")
async def block_loop(job):  # a bad async handler: blocks the event loop with a sync wait
    open(os.path.join(job.data, "started"), "w").close()
    while not os.path.exists(os.path.join(job.data, "release")):
        time.sleep(0.01)
    return "released"
"""


def test_a_blocked_event_loop_fails_livez(start_worker, tmp_path: Path, redis_url: str, queue_name: str) -> None:
    (tmp_path / "blocking_handlers.py").write_text(BLOCKING_HANDLERS)
    env = subprocess_env(CHASQUI_REDIS_URL=redis_url)
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    port = free_port()
    proc = start_worker(["-q", queue_name, "-H", "blocking_handlers", "--metrics-port", str(port)], env=env)
    proc.wait_for_log("/metrics")
    wait_until_sync(lambda: _probe(port, "/livez") == (200, LIVE), 120, what="live")
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("block_loop", str(tmp_path))
        wait_until_sync(lambda: (tmp_path / "started").exists(), 120, what="the blocking handler to start")
        stuck = {"status": "fail", "checks": {"event_loop": False, "tasks": True}}
        assert _probe(port, "/livez") == (503, stuck)
        assert http_get(f"http://127.0.0.1:{port}/metrics")[0] == 200  # scrapes still answer
        (tmp_path / "release").touch()
        assert q.wait_for_result(job.id, timeout=120) == "released"
    wait_until_sync(lambda: _probe(port, "/livez") == (200, LIVE), 120, what="live again")
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(180) == 0, proc.output()


def _serve_jobs_with_metrics(start_worker, url: str, queue: str, n: int = 20) -> None:
    port = free_port()
    proc = start_worker(
        ["-q", queue, "-H", "worker_handlers", "--metrics-port", str(port), "--metrics-interval", "0.2"],
        env=subprocess_env(CHASQUI_REDIS_URL=url),
    )
    proc.wait_for_log("/metrics")
    with SyncQueue(queue, redis_url=url) as q:
        q.add_bulk([{"name": "echo", "data": i} for i in range(n)])
        q.add("echo", "later", delay=3_600_000)

    def settled() -> str | None:
        text = _scrape(port)
        done = metric_value(text, "chasqui_jobs_completed_total", queue=queue, name="echo") == n
        # a job counts as completed when its handler returns; its ack (and so pending 0) follows in
        # the next flush, and the depth sample after that: wait for all three
        acked = metric_value(text, "chasqui_pending_jobs", queue=queue, group="default") == 0
        return text if done and acked and metric_value(text, "chasqui_delayed_jobs", queue=queue) == 1 else None

    text = wait_until_sync(settled, 120, what=f"{n} jobs completed, acked and sampled", interval=0.05)
    assert metric_value(text, "chasqui_depth_sample_errors_total", queue=queue) in (None, 0)
    assert _probe(port, "/readyz") == (200, READY) and _probe(port, "/livez") == (200, LIVE)
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(180) == 0, proc.output()
    assert "Traceback" not in proc.output(), proc.output()


@pytest.mark.timeout(300)
def test_metrics_with_a_cluster_url(start_worker, cluster_server, queue_name: str) -> None:
    """Regression: --metrics-port with a ?cluster=true URL failed at start."""
    _serve_jobs_with_metrics(start_worker, cluster_server.url, queue_name)


@pytest.mark.timeout(300)
def test_metrics_with_a_sentinel_url(start_worker, tmp_path: Path, queue_name: str) -> None:
    """Regression: --metrics-port with a redis+sentinel:// URL failed at start."""
    master = start_server("redis7", tmpdir=tmp_path)
    sentinel = None
    try:
        sentinel = start_sentinel(binary_for("redis7"), tmp_path, "chasqui-m", master.port)
        _serve_jobs_with_metrics(start_worker, f"redis+sentinel://127.0.0.1:{sentinel.port}/chasqui-m/0", queue_name)
    finally:
        if sentinel is not None:
            sentinel.stop()
        master.stop()


# ---- in process --------------------------------------------------------------------------
def test_probe_verdicts(redis_url: str, queue_name: str) -> None:
    sink = PrometheusMetrics(known_names=["a"])
    running = {"yes": False}
    report: dict = {"reader": True, "slots": {"alive": True, "busy": 3}, "flusher": True}
    server = MetricsServer(
        sink,
        port=0,
        sampler=DepthSampler(redis_url, queue_name),
        interval=60,
        loop_deadline=0.5,
        is_running=lambda: running["yes"],
        health=lambda: report,
        queue=queue_name,
    ).start()
    loop = asyncio.new_event_loop()
    spinning = threading.Thread(target=loop.run_forever, daemon=True)
    spinning.start()
    try:
        assert server.host == "127.0.0.1"  # the default
        assert _probe(server.port, "/readyz") == (
            503,
            {"status": "fail", "checks": {"worker_running": False, "redis": True}},
        )
        assert _probe(server.port, "/livez") == (200, LIVE)  # no loop attached yet: starting up
        running["yes"] = True
        server.attach_loop(loop)
        assert _probe(server.port, "/readyz") == (200, READY) and _probe(server.port, "/livez") == (200, LIVE)

        release = threading.Event()
        loop.call_soon_threadsafe(release.wait)  # the loop is stuck in a callback
        assert _probe(server.port, "/livez") == (
            503,
            {"status": "fail", "checks": {"event_loop": False, "tasks": True}},
        )
        assert _probe(server.port, "/readyz") == (200, READY)
        release.set()
        wait_until_sync(lambda: _probe(server.port, "/livez") == (200, LIVE), 60, what="the loop to answer")

        for dead in ({"flusher": False}, {"slots": {"alive": False}}, None):
            report = dict(report, **dead) if dead else None  # None: health() raises below
            if dead is None:
                server.health_source = lambda: 1 / 0
            status, body = _probe(server.port, "/livez")
            assert (status, body["checks"]["tasks"]) == (503, False), body
            assert "ZeroDivisionError" not in json.dumps(body)
        loop.call_soon_threadsafe(loop.stop)
        spinning.join(10)
        loop.close()
        assert _probe(server.port, "/livez")[1]["checks"]["event_loop"] is False  # a closed loop is dead
        text = _scrape(server.port)
        assert metric_value(text, "chasqui_stream_length", queue=queue_name) == 0  # no stream yet: 0, no error
    finally:
        server.stop()
        if not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)


def test_unreachable_redis_fails_readyz_without_error_text(queue_name: str) -> None:
    sink = PrometheusMetrics()
    dead = f"redis://:hunter2-pw@127.0.0.1:{free_port()}/0"
    server = MetricsServer(sink, port=0, sampler=DepthSampler(dead, queue_name), interval=60, queue=queue_name).start()
    try:
        status, body = http_get(f"http://127.0.0.1:{server.port}/readyz")
        assert (status, json.loads(body)) == (
            503,
            {"status": "fail", "checks": {"worker_running": True, "redis": False}},
        )
        assert _probe(server.port, "/livez") == (200, LIVE)
        assert metric_value(_scrape(server.port), "chasqui_depth_sample_errors_total", queue=queue_name) == 1
    finally:
        server.stop()


def _threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("chasqui-metrics"))


@pytest.mark.timeout(120)
def test_idle_and_slow_clients_cannot_exhaust_the_server() -> None:
    """A slowloris: hundreds of connections that send nothing or half a request head."""
    server = MetricsServer(PrometheusMetrics(), port=0, header_timeout=2.0, max_connections=32, workers=2).start()
    held: list[socket.socket] = []
    try:
        assert _threads() == 3  # the selector and two answering threads, fixed
        for i in range(300):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            if i % 2:
                s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")  # never finished
            held.append(s)
        started = time.monotonic()
        assert _probe(server.port, "/livez") == (200, LIVE)
        assert time.monotonic() - started < 10
        assert _threads() == 3
        # every idle or unfinished connection is closed by the server within the header timeout
        for s in held:
            s.settimeout(30)
            try:
                assert s.recv(1) == b""
            except ConnectionResetError:
                pass
        for request, status in (
            (b"POST /metrics HTTP/1.1\r\n\r\n", b"405"),
            (b"\x00\xff junk\r\n\r\n", b"400"),
            (b"GET /" + b"a" * 10_000, b"431"),
            (b"GET /livez?x=1 HTTP/1.0\r\n\r\n", b"200"),
        ):
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as s:
                s.sendall(request)
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
                assert reply.split(b" ", 2)[1] == status, reply[:200]
                assert b"Connection: close" in reply
    finally:
        for s in held:
            s.close()
        server.stop()
    assert wait_until_sync(lambda: _threads() == 0, 30, what="the metrics threads to end")


def test_bad_probe_settings_are_refused() -> None:
    for bad in ({"interval": 0}, {"loop_deadline": float("nan")}, {"header_timeout": -1}):
        with pytest.raises(ConfigError):
            MetricsServer(PrometheusMetrics(), port=0, **bad)


def test_unregistered_names_share_one_label() -> None:
    sink = PrometheusMetrics(known_names=["known"])
    for name in ("known", "evil-1", "evil-2"):
        sink.job_dead("q", name, "unrecoverable")
    text = sink.exposition()[0].decode()
    assert metric_value(text, "chasqui_jobs_dead_lettered_total", queue="q", name="known", reason="unrecoverable") == 1
    assert (
        metric_value(
            text, "chasqui_jobs_dead_lettered_total", queue="q", name="__unregistered__", reason="unrecoverable"
        )
        == 2
    )


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
    proc = subprocess.run(
        [
            *chasqui_command(),
            "worker",
            "-q",
            queue_name,
            "-H",
            "worker_handlers",
            "--redis-url",
            redis_url,
            "--metrics-port",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 2 and "airflow-provider-chasqui[metrics]" in proc.stderr, proc.stderr


def test_metrics_port_in_use_exits_2(redis_url: str, queue_name: str) -> None:
    import socket
    import subprocess

    from worker_support import chasqui_command, subprocess_env

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [
                *chasqui_command(),
                "worker",
                "-q",
                queue_name,
                "-H",
                "worker_handlers",
                "--redis-url",
                redis_url,
                "--metrics-port",
                str(port),
                "--metrics-host",
                "127.0.0.1",
            ],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert proc.returncode == 2 and f"cannot serve metrics on 127.0.0.1:{port}" in proc.stderr, proc.stderr


def test_alerting_metrics_after_a_scenario(start_worker, redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """The metrics docs/metrics.md suggests alerts on, scraped from a real worker after a scenario
    that moves each: a job left waiting, a delayed job overdue (no promoter), a running job's lease
    renewed and then taken over by another consumer, a quarantined spec, a dead letter by reason."""
    keys = QueueKeys.for_queue(queue_name)
    port = free_port()
    q = SyncQueue(queue_name, redis_url=redis_url)
    q.add("echo", "overdue", delay_ms=1)  # no promoter runs: it stays in the delayed set, overdue
    held = [q.add("hold", {"dir": str(tmp_path), "max_hold": 60}) for _ in range(3)]
    proc = start_worker(
        [
            "-q",
            queue_name,
            "-H",
            "worker_handlers",
            "--no-scheduler",
            "--no-promoter",
            "--concurrency",
            "1",
            "--prefetch",
            "1",
            "--claim-min-idle-ms",
            "900",
            "--metrics-port",
            str(port),
            "--metrics-interval",
            "0.2",
        ],
        env=subprocess_env(CHASQUI_REDIS_URL=redis_url),
    )
    proc.wait_for_log(f"on http://127.0.0.1:{port}/metrics")
    labels = {"queue": queue_name}
    group = {"queue": queue_name, "group": "default"}
    wait_until_sync(lambda: (tmp_path / f"started-{held[0].id}").exists(), 60, what="the first hold job to run")
    with redis.Redis.from_url(redis_url) as r:
        r.hset(keys.repeat_quarantine, "broken::every:1000", b"\xc1")  # what the scheduler quarantines

        def busy() -> str | None:
            text = _scrape(port)
            ok = (
                (metric_value(text, "chasqui_oldest_waiting_job_age_seconds", **labels) or 0) > 0
                and metric_value(text, "chasqui_delayed_overdue_jobs", **labels) == 1
                and metric_value(text, "chasqui_consumers", **group) == 1
                and (metric_value(text, "chasqui_lease_renewals_total", **labels) or 0) >= 1
                and metric_value(text, "chasqui_scheduler_quarantined_specs", **labels) == 1
            )
            return text if ok else None

        text = wait_until_sync(
            busy, 60, what="waiting, overdue, consumer, renewal and quarantine metrics", interval=0.05
        )
        # a worker that reads every read_block_ms is never idle much longer than that
        assert 0 <= metric_value(text, "chasqui_consumer_max_idle_seconds", **group) < 60
        for task in ("reader", "slots", "flusher", "lease"):  # present at 0 before any restart
            assert metric_value(text, "chasqui_task_restarts_total", queue=queue_name, task=task) == 0
        assert (
            metric_value(text, "chasqui_leases_lost_total", **labels) is None
            or metric_value(text, "chasqui_leases_lost_total", **labels) == 0
        )
        # another consumer takes over the running job's entry: the next renewal finds the lease lost
        running = r.xpending_range(keys.stream, "default", "-", "+", 10)
        stolen = min(running, key=lambda p: p["message_id"])["message_id"]
        assert r.xclaim(keys.stream, "default", "thief", 0, [stolen], justid=True) == [stolen]
        wait_until_sync(
            lambda: (metric_value(_scrape(port), "chasqui_leases_lost_total", **labels) or 0) >= 1,
            60,
            what="the lost lease to be counted",
        )
        (tmp_path / "release").write_text("go")
        q.add("fail", "dead", attempts=1)
        q.add("echo", "quick")

        def settled() -> str | None:
            text = _scrape(port)
            ok = (
                metric_value(text, "chasqui_oldest_waiting_job_age_seconds", **labels) == 0
                and metric_value(
                    text, "chasqui_jobs_dead_lettered_total", **labels, name="fail", reason="retries_exhausted"
                )
                == 1
                and (metric_value(text, "chasqui_jobs_completed_total", **labels, name="echo") or 0) >= 1
            )
            return text if ok else None

        text = wait_until_sync(settled, 120, what="the held jobs, the dead letter and the quick job", interval=0.05)
    proc.wait_for_log("lease lost on 1 entries")
    # buckets from 1 ms to 4 h: millisecond handlers and hour-long Spark jobs both resolve
    for le in ("0.001", "14400.0", "+Inf"):
        assert metric_value(text, "chasqui_handler_duration_seconds_bucket", **labels, name="echo", le=le) is not None
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(60) == 0


def test_flow_control_metrics(start_worker, redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """Issue 24: a queue limited to one running job, with three jobs that hold until released:
    the worker reports 2 jobs held back, 1 slot held of a limit of 1; paused, it reports the
    pause; released, every job runs and nothing is held back."""
    port = free_port()
    q = SyncQueue(queue_name, redis_url=redis_url)
    q.set_concurrency(1)
    jobs = [q.add("hold", {"dir": str(tmp_path), "max_hold": 60}) for _ in range(3)]
    proc = start_worker(
        ["-q", queue_name, "-H", "worker_handlers", "--no-scheduler", "--metrics-port", str(port)]
        + ["--metrics-interval", "0.2"],
        env=subprocess_env(CHASQUI_REDIS_URL=redis_url),
    )
    proc.wait_for_log(f"on http://127.0.0.1:{port}/metrics")
    labels = {"queue": queue_name}

    def gauges(held: int, slots: int, paused: int) -> str | None:
        text = _scrape(port)
        ok = (
            metric_value(text, "chasqui_jobs_held_back", **labels) == held
            and metric_value(text, "chasqui_concurrency_slots_held", **labels) == slots
            and metric_value(text, "chasqui_concurrency_limit", **labels) == 1
            and metric_value(text, "chasqui_queue_paused", **labels) == paused
        )
        return text if ok else None

    wait_until_sync(lambda: gauges(2, 1, 0), 60, what="2 held back, 1 slot of 1", interval=0.05)
    assert sum((tmp_path / f"started-{j.id}").exists() for j in jobs) == 1  # one runs, the limit holds
    q.pause()
    wait_until_sync(lambda: gauges(2, 1, 1), 60, what="the pause reported", interval=0.05)
    q.resume()
    (tmp_path / "release").write_text("go")
    for j in jobs:
        assert q.wait_for_result(j.id, timeout=60) == {"held": j.id}
    wait_until_sync(lambda: gauges(0, 0, 0), 60, what="nothing held back", interval=0.05)
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit(60) == 0
    q.close()


def test_task_restarts_and_bounded_dlq_reasons_are_counted(redis_url: str, queue_name: str) -> None:
    """A supervised task that crashes is counted by role; unknown DLQ reasons share one label."""
    import redis.asyncio

    from airflow_provider_chasqui import Worker

    keys = QueueKeys.for_queue(queue_name)
    sink = PrometheusMetrics()
    sink.job_dead(queue_name, "x", "some_new_reason")
    sink.job_dead(queue_name, "x", "malformed")

    async def scenario() -> None:
        r = redis.asyncio.Redis.from_url(redis_url)
        try:
            await r.set(keys.dlq, "not a stream")  # dead-lettering the malformed entry fails: the reader restarts
            w = Worker(
                queue_name,
                lambda job: None,
                redis_url=redis_url,
                metrics=sink,
                claim_min_idle_ms=1000,
                run_scheduler=False,
            )
            task = asyncio.create_task(w.run())
            try:
                await r.xadd(keys.stream, {"x": "no payload"})
                deadline = time.monotonic() + 60
                while metric_value(
                    sink.exposition()[0].decode(), "chasqui_task_restarts_total", queue=queue_name, task="reader"
                ) in (None, 0.0):
                    assert time.monotonic() < deadline, sink.exposition()[0].decode()
                    await asyncio.sleep(0.05)
            finally:
                await w.close()
                await asyncio.wait_for(task, 60)
                await r.delete(keys.dlq, keys.stream)
        finally:
            await r.aclose()

    asyncio.run(scenario())
    text = sink.exposition()[0].decode()
    assert metric_value(text, "chasqui_jobs_dead_lettered_total", queue=queue_name, name="x", reason="other") == 1
    assert metric_value(text, "chasqui_jobs_dead_lettered_total", queue=queue_name, name="x", reason="malformed") == 1
    assert metric_value(text, "chasqui_task_restarts_total", queue=queue_name, task="flusher") == 0


def test_per_group_gauges_follow_the_groups_in_turn(redis_url: str, queue_name: str) -> None:
    """Issue 24: waiting and running jobs per job group, for the groups next in turn (at most 10
    label values, hostile group names included); a group that leaves the turn loses its series."""
    evil = 'tenant "7"\n<b>\u00e9'
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.set_group_limits(concurrency=2)
        for i in range(3):
            q.add("n", i, group="tenant-a")
        q.add("n", 9, group=evil)
        for i in range(12):
            q.add("n", i, group=f"g{i:02}")
        sampler, metrics = DepthSampler(redis_url, queue_name), PrometheusMetrics()
        try:
            metrics.set_depths(queue_name, "default", sampler.sample())
            text = metrics.exposition()[0].decode()
            waiting = {
                line.split('job_group="', 1)[1].rsplit('",queue="', 1)[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("chasqui_group_jobs_waiting{")
            }
            assert len(waiting) == 10, waiting  # bounded: the first 10 in turn
            assert waiting.get("tenant-a") == 3 and waiting.get('tenant \\"7\\"\\n<b>\u00e9') == 1, waiting
            assert metric_value(text, "chasqui_group_jobs_running", queue=queue_name, job_group="tenant-a") == 0
            q.drain()
            metrics.set_depths(queue_name, "default", sampler.sample())
            text = metrics.exposition()[0].decode()
            assert "chasqui_group_jobs_waiting{" not in text and "chasqui_group_jobs_running{" not in text
        finally:
            sampler.close()
