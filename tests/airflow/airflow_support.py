"""Helpers the Airflow provider tests import (kept out of conftest.py so they import by name)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis

from airflow_provider_chasqui.core.keys import QueueKeys

__all__ = ["conn_json", "WorkerProcess", "run_dags", "delete_queue_keys"]

HERE = Path(__file__).resolve().parent


def conn_json(redis_url: str, **extra: object) -> str:
    """``AIRFLOW_CONN_*`` JSON for a standalone connection to ``redis_url``."""
    parsed = redis.connection.parse_url(redis_url)
    return json.dumps(
        {
            "conn_type": "chasqui",
            "host": parsed.get("host", "127.0.0.1"),
            "port": parsed.get("port", 6379),
            "extra": {"db": parsed.get("db", 0), **extra},
        }
    )


def delete_queue_keys(redis_url: str, queue: str) -> None:
    """Drop every ``{chasqui:<queue>}*`` key (SCAN + UNLINK; never a FLUSH on the shared server)."""
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in QueueKeys.for_queue(queue).prefix) + "*"
    with redis.Redis.from_url(redis_url) as r:
        keys = list(r.scan_iter(match=pattern, count=1000))
        if keys:
            r.unlink(*keys)


class WorkerProcess:
    """A real worker subprocess (``worker_main.py``) on one queue; ``stop()`` sends SIGTERM.

    Its output goes to a file (a pipe nobody drains could block it); the constructor waits,
    with a deadline, for the ``READY`` line.
    """

    def __init__(self, redis_url: str, queue: str, log_path: Path, timeout: float = 30.0) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(HERE / "worker_main.py"), redis_url, queue], stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout
        while "READY" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise RuntimeError(f"worker did not start:\n{self.output()}")
            time.sleep(0.02)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout)
        return self.output()


def run_dags(env: dict[str, str], plan: list[list[object]], timeout: float = 280) -> list[dict]:
    """``dag.test()`` of each ``[dag_id, run_conf]`` in one ``run_dag.py`` subprocess.

    Returns one summary per run; each carries the whole process log (``log``) and the
    process wall time (``process_seconds``, Airflow's start-up included).
    """
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(HERE / "run_dag.py"), json.dumps(plan)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    log = proc.stdout
    assert proc.returncode == 0, log[-6000:]
    summaries = [json.loads(line[len("RESULT ") :]) for line in log.splitlines() if line.startswith("RESULT ")]
    assert len(summaries) == len(plan), log[-6000:]
    elapsed = round(time.monotonic() - started, 3)
    return [{**s, "log": _run_log(log, i), "process_seconds": elapsed} for i, s in enumerate(summaries)]


def _run_log(log: str, index: int) -> str:
    """The log lines of run ``index`` (runs are separated by their RESULT lines)."""
    parts = log.split("\nRESULT ")
    return parts[index] if index < len(parts) else ""


def stop_services(procs: dict[str, subprocess.Popen]) -> None:
    """Stop Airflow service subprocesses (each its own process group): TERM, then KILL at 30 s."""
    for proc in procs.values():
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs.values():
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
