"""One run through the real Airflow services: api-server, scheduler (LocalExecutor) and
the triggerer, each its own process, on a private AIRFLOW_HOME (a copy of the migrated DB).

The example ``chasqui_enqueue_and_wait`` DAG is triggered with the CLI; its ``square`` task
defers, and ``ChasquiJobTrigger`` runs inside the triggerer process (its per-trigger log
shows it) while a real worker drains the queue.  ``dag.test()`` cannot show this: it runs
triggers inline (and ``dag.test(use_executor=True)`` hangs in ``LocalExecutor.end()`` on
Airflow 3.3.2, so the scheduler drives the run here).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from airflow_support import WorkerProcess, delete_queue_keys, stop_services
from cryptography.fernet import Fernet
from servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
DAG_ID = "chasqui_enqueue_and_wait"


def _query(db: Path, sql: str, *args: object) -> list[tuple]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10) as conn:
        return conn.execute(sql, args).fetchall()


def _wait_for(what: str, cond, timeout: float, procs: dict[str, subprocess.Popen], logs: Path) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        dead = {name: p.returncode for name, p in procs.items() if p.poll() is not None}
        assert not dead, f"Airflow services exited while waiting for {what}: {dead}\n{_tail(logs)}"
        assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}\n{_tail(logs)}"
        time.sleep(0.5)


def test_real_triggerer_runs_the_chasqui_trigger(airflow_home: dict[str, str], redis_url: str, tmp_path: Path) -> None:
    home = tmp_path / "airflow"
    (home / "dags").mkdir(parents=True)
    shutil.copy(Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db.migrated", home / "airflow.db")
    shutil.copy(Path(airflow_home["AIRFLOW__CORE__DAGS_FOLDER"]) / "enqueue_and_wait.py", home / "dags")
    db = home / "airflow.db"
    port = free_port()
    env = {
        **airflow_home,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        # one key for every process: each would otherwise write its own into airflow.cfg
        "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",  # the 5 s default fails tasks on a loaded CI box
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
    }
    queue = f"t-triggerer-{uuid.uuid4().hex[:6]}"

    def airflow(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, timeout=180
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    started = time.monotonic()
    airflow("dags", "reserialize")  # the scheduler needs the serialized DAG; no dag-processor required
    procs: dict[str, subprocess.Popen] = {}
    worker = WorkerProcess(redis_url, queue, tmp_path / "worker.log")

    def start(name: str, *args: str) -> None:
        with open(tmp_path / f"{name}.log", "wb") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "airflow", *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v2/monitor/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    try:
        start("api-server", "api-server", "--port", str(port))  # tasks call its execution API: up first
        start("triggerer", "triggerer", "--skip-serve-logs")
        _wait_for("the api-server", healthy, 180, procs, tmp_path)
        start("scheduler", "scheduler", "--skip-serve-logs")
        airflow("dags", "trigger", DAG_ID, "-c", json.dumps({"queue": queue}))
        triggered = time.monotonic()
        state = _wait_for(
            "the DAG run to finish",
            lambda: (
                [
                    r[0]
                    for r in _query(db, "select state from dag_run where dag_id = ?", DAG_ID)
                    if r[0] in ("success", "failed")
                ]
            ),
            300,
            procs,
            tmp_path,
        )
        finished = time.monotonic()
        tis = dict(_query(db, "select task_id, state from task_instance where dag_id = ?", DAG_ID))
        assert state == ["success"], (tis, _tail(tmp_path))
        assert tis == {"square": "success", "enqueue_greet": "success", "wait_greet": "success", "report": "success"}
        xcom = dict(_query(db, "select task_id, value from xcom where dag_id = ? and key = 'return_value'", DAG_ID))
        assert json.loads(xcom["square"]) == {"x": 7, "square": 49}
        assert json.loads(xcom["report"]) == "hello, airflow: 7^2 = 49"
        trigger_logs = list(home.glob(f"logs/dag_id={DAG_ID}/*/task_id=square/attempt=1.log.trigger.*.log"))
        assert len(trigger_logs) == 1, list(home.glob("logs/**/*"))
        trigger_log = trigger_logs[0].read_text()
        assert f"waiting for 1 job(s) on queue {queue}" in trigger_log
        assert "Trigger fired event" in trigger_log and "'square': 49" in trigger_log
        print(
            f"real triggerer: services up + run {finished - started:.1f} s "
            f"(DAG run {finished - triggered:.1f} s after `airflow dags trigger`)"
        )
    finally:
        stop_services(procs)
        worker.stop()
        delete_queue_keys(redis_url, queue)


def _tail(tmp_path: Path) -> str:
    """The end of every service log and every task/trigger log, for a failure message."""
    logs = sorted(tmp_path.glob("*.log")) + sorted(tmp_path.glob("airflow/logs/dag_id=*/**/*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}" for p in logs)
