"""The real ``chasqui worker`` command in subprocesses against the real Redis: batch mode,
argument and handler errors, the SIGTERM drain and its deadline, ``--conn-id``, import isolation."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from engine_support import wait_until_sync
from servers import free_port
from worker_support import ROOT, chasqui_command, http_get, metric_value, subprocess_env

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys

pytestmark = pytest.mark.timeout(300)  # deadlines are generous: CI machines are shared


def _pending(url: str, queue: str) -> int:
    with redis.Redis.from_url(url) as r:
        try:
            return int(r.xpending(QueueKeys.for_queue(queue).stream, "default")["pending"])
        except redis.ResponseError:  # no group yet
            return 0


def test_batch_mode_runs_max_jobs_then_exits(start_worker, redis_url: str, queue_name: str) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        jobs = q.add_bulk([{"name": "echo", "data": i} for i in range(5)])
        proc = start_worker(
            ["-q", queue_name, "-H", "worker_handlers", "--redis-url", redis_url, "--max-jobs", "5", "--no-scheduler"]
        )
        assert proc.wait_exit(180) == 0, proc.output()
        assert q.get_job_result_bulk([j.id for j in jobs]) == [{"echo": i} for i in range(5)]
    out = proc.output()
    assert "handlers: echo <- worker_handlers" in out and "reached max_jobs=5" in out


def test_idle_exit_with_the_promoter_and_scheduler_loops(start_worker, redis_url: str, queue_name: str) -> None:
    """Default flags: promoter and scheduler run; an empty queue ends the batch after --idle-exit."""
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("echo", "late", delay=300)  # promoted by the worker's own promoter
        proc = start_worker(
            [
                "-q",
                queue_name,
                "-H",
                "worker_handlers",
                "--redis-url",
                redis_url,
                "--idle-exit",
                "1.5",
                "--log-level",
                "debug",
            ]
        )
        assert proc.wait_exit(180) == 0, proc.output()
        assert q.get_job_result(job.id) == {"echo": "late"}
    out = proc.output()
    assert "acquired lock" in out and "idle for 1.5s; exiting" in out


def test_python_dash_m_entry(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("echo", 1)
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "airflow_provider_chasqui.worker",
                "-q",
                queue_name,
                "-H",
                "worker_handlers:echo",
                "--redis-url",
                redis_url,
                "--max-jobs",
                "1",
                "--no-scheduler",
            ],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert proc.returncode == 0, proc.stderr
        assert q.get_job_result(job.id) == {"echo": 1}


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*chasqui_command(), "worker", *args],
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=180,
        cwd=str(ROOT),
    )


def test_handler_errors_exit_2_with_the_reason(redis_url: str, queue_name: str) -> None:
    base = ["-q", queue_name, "--redis-url", redis_url]
    cases = {
        "no_such_handler_module": (
            "handler module 'no_such_handler_module' (from 'no_such_handler_module') was not found"
        ),
        "worker_handlers:missing": "worker_handlers has no attribute 'missing'",
        "worker_support:ROOT": "worker_support:ROOT is a PosixPath, not a handler",
        "not a spec": "is not pkg.module or pkg.module:attr",
    }
    for spec, message in cases.items():
        proc = _run([*base, "-H", spec])
        assert proc.returncode == 2, (spec, proc.stderr)
        assert message in proc.stderr, (spec, proc.stderr)
        assert "Traceback" not in proc.stderr
    assert _pending(redis_url, queue_name) == 0


def test_a_handler_module_exiting_at_import_exits_2_saying_so(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """A handler module that is also a script (``sys.exit(main())`` with no ``__main__`` guard)
    made the worker exit quietly, with code 0 for ``sys.exit(0)``: a supervisor restarting only
    failures left no worker running, and nothing said why."""
    (tmp_path / "script_like_handlers.py").write_text(
        "import sys\n\ndef h(job):\n    return 1\n\nHANDLERS = {'h': h}\nsys.exit(0)\n"
    )
    proc = subprocess.run(
        [*chasqui_command(), "worker", "-q", queue_name, "--redis-url", redis_url, "-H", "script_like_handlers"],
        env=subprocess_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "'script_like_handlers' (from 'script_like_handlers') called sys.exit(0)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_usage_errors_exit_2() -> None:
    for args in (
        ["-H", "worker_handlers", "--concurrency", "0", "-q", "x"],
        ["-H", "worker_handlers", "-q", "x", "--redis-url", "u", "--conn-id", "c"],
        ["-q", "x"],
    ):
        proc = _run(args)
        assert proc.returncode == 2 and "error:" in proc.stderr, (args, proc.stderr)


def test_sigterm_stops_reading_and_lets_running_jobs_finish(
    start_worker, redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        held = [q.add("hold", {"dir": str(tmp_path)}) for _ in range(3)]
        proc = start_worker(
            [
                "-q",
                queue_name,
                "-H",
                "worker_handlers",
                "--redis-url",
                redis_url,
                "--concurrency",
                "2",
                "--no-scheduler",
                "--shutdown-deadline",
                "60",
            ]
        )
        started = lambda: sorted(p.name for p in tmp_path.glob("started-*"))  # noqa: E731
        wait_until_sync(lambda: len(started()) == 2, 120, what="two held jobs running")
        assert _pending(redis_url, queue_name) == 3  # the third was read and waits in the worker
        proc.signal(signal.SIGTERM)
        proc.wait_for_log("no longer reading")
        late = q.add("echo", "after SIGTERM")  # must not be read by a stopping worker
        assert proc.proc.poll() is None  # still draining: the held jobs are running
        (tmp_path / "release").write_text("go")
        assert proc.wait_exit(180) == 0, proc.output()
        assert q.get_job_result_bulk([j.id for j in held]) == [{"held": j.id} for j in held]
        assert q.get_job_result(late.id) is None
    assert _pending(redis_url, queue_name) == 0
    with redis.Redis.from_url(redis_url) as r:
        assert r.xlen(QueueKeys.for_queue(queue_name).stream) == 1  # only the late job, never delivered
    assert "stopped after 3 jobs" in proc.output()


def test_sigterm_deadline_leaves_the_job_pending_for_reclaim(
    start_worker, redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("hold", {"dir": str(tmp_path), "max_hold": 30})
        proc = start_worker(
            [
                "-q",
                queue_name,
                "-H",
                "worker_handlers",
                "--redis-url",
                redis_url,
                "--no-scheduler",
                "--shutdown-deadline",
                "0.5",
            ]
        )
        wait_until_sync(lambda: any(tmp_path.glob("started-*")), 120, what="the held job running")
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit(180) == 0, proc.output()
        assert q.get_job_result(job.id) is None
    assert _pending(redis_url, queue_name) == 1  # not acked, not lost: another worker reclaims it
    out = proc.output()
    assert "1 handlers still running at the shutdown deadline" in out
    assert "still running after the shutdown deadline; exiting without them" in out


def test_a_handler_ignoring_its_cancellation_does_not_hold_the_stopped_process(
    start_worker, redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    """An ``async def`` handler swallowing every cancellation: its timed-out job is dead-lettered
    without it, and after SIGTERM the process exits (status 0) instead of waiting for it for
    ever (``asyncio.run`` waits for every task it cancels; this one never ends)."""
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("stubborn", {"dir": str(tmp_path), "max_hold": 170}, timeout_ms=500, attempts=1)
        port = free_port()
        proc = start_worker(
            ["-q", queue_name, "-H", "worker_handlers", "--redis-url", redis_url, "--no-scheduler"]
            + ["--shutdown-deadline", "60", "--store-results", "--metrics-port", str(port)]
        )
        wait_until_sync(lambda: any(tmp_path.glob("started-*")), 120, what="the stubborn job running")
        failure = wait_until_sync(lambda: q.get_failure(job.id), 60, what="the job dead-lettered for its timeout")
        assert failure.error.startswith("timeout:")
        proc.wait_for_log("ignored the cancellation")
        # what an operator sees meanwhile: `chasqui workers` says the handler runs on
        wait_until_sync(lambda: _left_running(redis_url, queue_name) == 1, 60, what="`chasqui workers --json` at 1")
        table = _chasqui("workers", queue_name, "--redis-url", redis_url).splitlines()
        assert table[0].rstrip().endswith("health  left running") and table[2].rstrip().endswith("ok      1"), table
        gauge = "chasqui_handlers_left_running"
        wait_until_sync(
            lambda: metric_value(http_get(f"http://127.0.0.1:{port}/metrics")[1], gauge, queue=queue_name) == 1,
            60,
            what="the gauge at 1",
        )
        assert http_get(f"http://127.0.0.1:{port}/livez")[0] == 200  # the worker itself works: no restart
        t0 = time.monotonic()
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit(60) == 0, proc.output()
        assert time.monotonic() - t0 < 30  # not the 60 s shutdown deadline, nor the handler's 170 s
    assert not (tmp_path / "release").exists()
    out = proc.output()
    assert "1 handlers that ignored their cancellation still running" in out
    assert "0 handler thread(s) and 1 handler task(s) still running" in out


def _chasqui(*args: str) -> str:
    """The ``chasqui`` command as an operator runs it; its stdout."""
    done = subprocess.run(
        [*chasqui_command(), *args], capture_output=True, text=True, env=subprocess_env(), timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _left_running(url: str, queue: str) -> int | None:
    workers = json.loads(_chasqui("workers", queue, "--json", "--redis-url", url))["workers"]
    return workers[0]["left_running"] if workers else None


def test_a_second_signal_exits_at_once(start_worker, redis_url: str, queue_name: str, tmp_path: Path) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.add("hold", {"dir": str(tmp_path), "max_hold": 30})
        proc = start_worker(
            [
                "-q",
                queue_name,
                "-H",
                "worker_handlers",
                "--redis-url",
                redis_url,
                "--no-scheduler",
                "--shutdown-deadline",
                "60",
            ]
        )
        wait_until_sync(lambda: any(tmp_path.glob("started-*")), 120, what="the held job running")
        proc.signal(signal.SIGINT)
        proc.wait_for_log("SIGINT: stopping")
        proc.signal(signal.SIGINT)
        assert proc.wait_exit(180) == 130
    assert "SIGINT again: exiting now" in proc.output()


@pytest.mark.airflow
def test_conn_id_resolves_an_airflow_connection(start_worker, redis_url: str, queue_name: str, tmp_path: Path) -> None:
    conn = redis.connection.parse_url(redis_url)
    spec = {
        "conn_type": "chasqui",
        "host": conn.get("host", "127.0.0.1"),
        "port": conn.get("port", 6379),
        "schema": str(conn.get("db", 0)),
        "extra": {"default_queue": queue_name},
    }
    env = subprocess_env(AIRFLOW_CONN_CHASQUI_WORKER_TEST=json.dumps(spec), AIRFLOW_HOME=str(tmp_path / "af"))
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("echo", "via connection")
        proc = start_worker(
            ["--conn-id", "chasqui_worker_test", "-H", "worker_handlers", "--max-jobs", "1", "--no-scheduler"], env=env
        )
        assert proc.wait_exit(180) == 0, proc.output()
        assert q.get_job_result(job.id) == {"echo": "via connection"}
    assert f"consuming {queue_name}" in proc.output()
    missing = _run(["--conn-id", "no_such_conn_q", "-H", "worker_handlers"], AIRFLOW_HOME=str(tmp_path / "af"))
    assert missing.returncode == 2 and "no_such_conn_q" in missing.stderr


def test_worker_modules_import_neither_airflow_nor_pyspark() -> None:
    code = (
        "import sys\n"
        "import airflow_provider_chasqui.cli, airflow_provider_chasqui.worker.cli\n"
        "import airflow_provider_chasqui.worker.spark, airflow_provider_chasqui.worker.metrics\n"
        "import airflow_provider_chasqui.worker.__main__, airflow_provider_chasqui.spark\n"
        "import airflow_provider_chasqui.examples.spark_handlers\n"
        "from airflow_provider_chasqui.worker.cli import build_parser\n"
        "build_parser().parse_args(['-q', 'x', '-H', 'm'])\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'pyspark', 'py4j'))\n"
        "print(bad)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=subprocess_env()
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
