"""Fixtures for the Airflow provider tests: a private AIRFLOW_HOME, a migrated sqlite
metadata DB, a DAG folder (the example DAGs plus tests/airflow/dags), the ``chasqui``
connection as an ``AIRFLOW_CONN_*`` variable, and real worker subprocesses.

AIRFLOW_HOME is set when this file is imported, before any test module imports Airflow,
so nothing here ever touches ~/airflow.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from airflow_support import WorkerProcess, conn_json
from services import (
    airflow_services,  # noqa: F401 - one definition: one set of services per session
    last_user,
    stop_after_last_user,
)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="chasqui-airflow-home-"))
DAGS = AIRFLOW_HOME / "dags"
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
}
os.environ.update(AIRFLOW_ENV)  # for Airflow imported in-process by the unit tests
atexit.register(shutil.rmtree, AIRFLOW_HOME, ignore_errors=True)


@pytest.hookimpl(trylast=True)  # after -k/-m deselection: the last test that will run
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    last_user(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Iterator[None]:
    """The session's Airflow services stop once the last test that uses them is torn down."""
    try:
        return (yield)
    finally:
        stop_after_last_user(item)


@pytest.fixture(scope="session")
def airflow_home(redis_url: str) -> Iterator[dict[str, str]]:
    """The migrated AIRFLOW_HOME and the environment subprocesses run Airflow with."""
    shutil.copytree(ROOT / "example_dags", DAGS, ignore=shutil.ignore_patterns("__pycache__"))
    for dag_file in (HERE / "dags").glob("*.py"):
        shutil.copy(dag_file, DAGS / dag_file.name)
    env = {
        **os.environ,
        **AIRFLOW_ENV,
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW_CONN_CHASQUI_DEFAULT": conn_json(redis_url),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    shutil.copy(AIRFLOW_HOME / "airflow.db", AIRFLOW_HOME / "airflow.db.migrated")  # for private homes
    yield env


@pytest.fixture(autouse=True)
def _chasqui_default(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process hooks find ``chasqui_default`` on the shared test Redis."""
    monkeypatch.setenv("AIRFLOW_CONN_CHASQUI_DEFAULT", conn_json(redis_url))


@pytest.fixture
def start_worker(redis_url: str, tmp_path: Path) -> Iterator[Callable[[str], WorkerProcess]]:
    """Start workers on demand; every one is stopped (SIGTERM, then checked) after the test."""
    workers: list[WorkerProcess] = []

    def start(queue: str) -> WorkerProcess:
        worker = WorkerProcess(redis_url, queue, tmp_path / f"worker-{len(workers)}.log")
        workers.append(worker)
        return worker

    yield start
    for worker in workers:
        out = worker.stop()
        assert worker.proc.returncode == 0, out[-3000:]
