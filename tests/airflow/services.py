"""The real Airflow services for tests: dag-processor, scheduler (LocalExecutor), triggerer and
api-server, each its own process group, on one private AIRFLOW_HOME (a copy of the migrated
sqlite DB) whose DAG folder holds every example DAG.

Use the ``airflow_services`` fixture (session scope: one set of services for every test that
asks for it).  ``tests/airflow/conftest.py`` imports it, so it has one definition: a module that
assigned it to a name of its own would get a second definition, and a second set of services.
Check outcomes in the metadata DB (``query``) or the REST API (``api``).
Every example DAG starts paused; a test unpauses what it runs (``unpause``), which also
registers asset watchers.  The queues of the examples come from environment variables read
at parse time (``CHASQUI_EVENTS_QUEUE``, ``CHASQUI_EXAMPLES_QUEUE``, ``CHASQUI_SPARK_QUEUE``,
``CHASQUI_SPARK_BATCH_QUEUE``; ``CHASQUI_DATA_DIR``): the fixture gives them names of their own
(``events_queue``, ``examples_queue``, ``spark_queue``, ``spark_batch_queue``; ``data_dir``) and
drops their keys at the end.  Tasks get ``spark-submit`` on PATH and ``SPARK_LOCAL_IP``.
The ``chasqui_default`` connection is stored in the metadata DB (``airflow connections add``),
never given to the services as an ``AIRFLOW_CONN_*`` variable.
Services are stopped by pid (their process groups) once the last test that uses them has run
(``stop_after_last_user``, hooked in ``tests/airflow/conftest.py``: idle, they cost the rest of
the run about a third of a core), and again, a no-op then, when the session ends.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow_support import conn_json, delete_queue_keys
from cryptography.fernet import Fernet
from servers import free_port

__all__ = ["AirflowServices", "airflow_services", "last_user", "stop_after_last_user"]

ROOT = Path(__file__).resolve().parents[2]
SERVICES = {
    "api-server": ("api-server",),  # tasks call its execution API: started first
    "dag-processor": ("dag-processor",),
    "triggerer": ("triggerer", "--skip-serve-logs"),
    "scheduler": ("scheduler", "--skip-serve-logs"),
}


def session_members(sessions: set[int]) -> list[int]:
    """Live (not zombie) processes whose session id is in ``sessions`` (from ``/proc/<pid>/stat``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session
        except OSError:
            continue
        if int(fields[3]) in sessions and fields[0] != "Z":
            found.append(int(entry))
    return found


class AirflowServices:
    """Handles on the running services: their environment, the metadata DB, the CLI, and
    start / kill / restart by name."""

    def __init__(self, base_env: dict[str, str], root: Path) -> None:
        self.root = root
        self.home = root / "airflow"
        self.logs = root / "service-logs"
        (self.home / "dags").mkdir(parents=True)
        self.logs.mkdir()
        shutil.copy(Path(base_env["AIRFLOW_HOME"]) / "airflow.db.migrated", self.home / "airflow.db")
        for dag_file in (ROOT / "example_dags").glob("*.py"):
            shutil.copy(dag_file, self.home / "dags" / dag_file.name)
        self.db = self.home / "airflow.db"
        self.port = free_port()
        tag = uuid.uuid4().hex[:6]
        self.events_queue = f"t-svc-events-{tag}"
        self.examples_queue = f"t-svc-examples-{tag}"
        self.spark_queue = f"t-svc-spark-{tag}"
        self.spark_batch_queue = f"t-svc-spark-batch-{tag}"
        self.data_dir = root / "data"
        bin_dir = str(Path(sys.executable).parent)  # spark-submit, for SparkSubmitOperator tasks
        self.env = {
            **base_env,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.home / "dags"),
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",  # LocalExecutor starts this many worker processes up front
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",  # a busy CI machine: tasks wait for the api-server
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.port}/execution/",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(self.port),
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
            # one key for all: the dag-processor encrypts the watchers' trigger kwargs, the triggerer
            # decrypts them (processes that each generate an airflow.cfg would each pick their own)
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",  # a killed triggerer's triggers move on
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3",  # unpaused DAGs register watchers soon
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "CHASQUI_EVENTS_QUEUE": self.events_queue,
            "CHASQUI_EXAMPLES_QUEUE": self.examples_queue,
            "CHASQUI_SPARK_QUEUE": self.spark_queue,
            "CHASQUI_SPARK_BATCH_QUEUE": self.spark_batch_queue,
            "CHASQUI_DATA_DIR": str(self.data_dir),
            # tasks (and the Spark drivers they start) import this tree, not an installed copy
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), base_env.get("PYTHONPATH", "")) if p),
            "PATH": os.pathsep.join((bin_dir, base_env.get("PATH", ""))),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
        }
        # the chasqui connection lives in the metadata database, as the UI or `airflow connections
        # add` make it (issue 28): no process of these services finds it in its environment
        self.env.pop("AIRFLOW_CONN_CHASQUI_DEFAULT", None)
        self.procs: dict[str, subprocess.Popen] = {}
        self.starts: dict[str, int] = {}
        self.sessions: set[int] = set()  # of every service started (killed ones included)
        self._token: str | None = None

    # -- processes -------------------------------------------------------------------------------
    def start(self, name: str) -> None:
        """Start one service (its own process group, output to ``service-logs/<name>-<n>.log``)."""
        assert name not in self.procs or self.procs[name].poll() is not None, f"{name} is running"
        args = SERVICES[name] + (("--port", str(self.port)) if name == "api-server" else ())
        self.starts[name] = self.starts.get(name, 0) + 1
        with open(self.logs / f"{name}-{self.starts[name]}.log", "wb") as log:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "airflow", *args],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.sessions.add(self.procs[name].pid)  # its session id: every process it starts stays in it

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Stop one service by pid (its process group); SIGKILL is a crash."""
        proc = self.procs.pop(name)
        if proc.poll() is None:
            os.killpg(proc.pid, sig)
        proc.wait(30)

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every service's process group, SIGKILL what still runs after ``grace`` s; then
        SIGKILL what is left in the services' sessions: task processes (and what they started,
        e.g. spark-submit's JVM) run in process groups of their own, in the scheduler's session."""
        sessions = set(self.sessions)
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        for pid in session_members(sessions):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while (left := session_members(sessions)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"processes left in the services' sessions: {left}"

    def check_alive(self) -> None:
        dead = {name: p.returncode for name, p in self.procs.items() if p.poll() is not None}
        assert not dead, f"Airflow services exited: {dead}\n{self.tail()}"

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v2/monitor/health", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    # -- helpers ---------------------------------------------------------------------------------
    def wait_for(self, what: str, cond: Callable[[], Any], timeout: float, interval: float = 0.25) -> Any:
        """Poll ``cond`` until truthy (its value is returned); fail if a service died or at the deadline."""
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            self.check_alive()
            assert time.monotonic() < deadline, f"timed out after {timeout}s waiting for {what}\n{self.tail()}"
            time.sleep(interval)

    def query(self, sql: str, *args: object) -> list[tuple]:
        """Read the metadata DB (read-only, so a query never blocks a service's write for long)."""
        with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=10) as conn:
            return conn.execute(sql, args).fetchall()

    def api(self, path: str, method: str = "GET", body: Any = None) -> Any:
        """The REST API (``/api/v2/...``) as an admin: the simple auth manager gives every caller
        a token (``SIMPLE_AUTH_MANAGER_ALL_ADMINS``); returns the decoded JSON reply."""
        base = f"http://127.0.0.1:{self.port}"
        if self._token is None:
            with urllib.request.urlopen(f"{base}/auth/token", timeout=30) as reply:
                self._token = json.load(reply)["access_token"]
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            f"{base}{path}",
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self._token}", "Content-Type": "application/json"},
        )
        for attempt in range(3):
            try:
                with urllib.request.urlopen(request, timeout=60) as reply:
                    return json.load(reply)
            except urllib.error.HTTPError as err:
                # the api-server on SQLite, busy with the scheduler, dag-processor and triggerer
                # of the same home, can answer 500 ("database is locked"): tried again, and a
                # POST that did land the first time is told apart by the caller (409)
                body = err.read().decode(errors="replace")[:2000]
                err.close()
                if err.code < 500 or attempt == 2:
                    raise AssertionError(f"{method} {path}: HTTP {err.code}: {body}") from err
                print(f"{method} {path}: HTTP {err.code}, trying again: {body}")
                time.sleep(2.0)
        raise AssertionError("unreachable")

    def airflow(self, *args: str, timeout: float = 120) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "airflow", *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    def wait_parsed(self, *dag_ids: str, timeout: float = 120) -> None:
        marks = ",".join("?" * len(dag_ids))
        self.wait_for(
            f"{dag_ids} to be parsed",
            lambda: len(self.query(f"select dag_id from dag where dag_id in ({marks})", *dag_ids)) == len(dag_ids),
            timeout,
        )

    def unpause(self, *dag_ids: str) -> None:
        """Unpause DAGs through the REST API (no CLI process to start); the dag-processor
        registers their asset watchers on its next parse."""
        self.wait_parsed(*dag_ids)
        for dag_id in dag_ids:
            reply = self.api(f"/api/v2/dags/{dag_id}?update_mask=is_paused", "PATCH", {"is_paused": False})
            assert reply["is_paused"] is False, reply

    def tail(self, chars: int = 2500) -> str:
        """The end of every service log and task/trigger log, for a failure message."""
        logs = sorted(self.logs.glob("*.log")) + sorted(self.home.glob("logs/dag_id=*/**/*.log"))[-6:]
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in logs)


@pytest.fixture(scope="session")
def airflow_services(airflow_home: dict[str, str], redis_url: str) -> Iterator[AirflowServices]:
    """The four services, started once per session; stopped by pid at its end."""
    root = Path(tempfile.mkdtemp(prefix="chasqui-airflow-services-"))
    services = AirflowServices(airflow_home, root)
    started = time.monotonic()
    try:
        services.airflow("connections", "add", "chasqui_default", "--conn-json", conn_json(redis_url))
        assert services.query("select conn_type from connection where conn_id = 'chasqui_default'") == [("chasqui",)]
        for name in SERVICES:
            services.start(name)
        services.wait_for("the api-server", services.healthy, 180, interval=0.5)
        print(f"airflow services: up in {time.monotonic() - started:.1f} s ({json.dumps(services.starts)})")
        _running.append(services)
        yield services
    finally:
        try:
            services.stop()
        finally:
            _cleanup(services, redis_url, root)


_running: list[AirflowServices] = []  # the session's services, once started
_last: list[str] = []  # the node id of the last test to run that uses them


def last_user(items: list[pytest.Item]) -> None:
    """Remember the last of the collected (and selected) ``items`` that uses the services."""
    users = [item.nodeid for item in items if "airflow_services" in getattr(item, "fixturenames", ())]
    _last[:] = users[-1:]


def stop_after_last_user(item: pytest.Item) -> None:
    """After ``item``'s teardown: if it was the last test that uses the services, stop them."""
    if _running and _last and item.nodeid == _last[0]:
        _running[0].stop()


def _cleanup(services: AirflowServices, redis_url: str, root: Path) -> None:
    """The queues' keys and the private home, whether or not the services stopped cleanly."""
    for queue in (services.events_queue, services.examples_queue, services.spark_queue, services.spark_batch_queue):
        delete_queue_keys(redis_url, queue)
    shutil.rmtree(root, ignore_errors=True)
