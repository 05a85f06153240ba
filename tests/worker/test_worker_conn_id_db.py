"""``chasqui worker --conn-id`` with the connection where the UI and ``airflow connections add``
put it: the metadata database of a real, migrated Airflow home (not an ``AIRFLOW_CONN_*``
variable).  The worker resolves it the way Airflow's own components do outside a task
(secrets backends, then the metadata database), and a missing id says what was tried."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from servers import start_auth_server
from worker_support import subprocess_env

from airflow_provider_chasqui import SyncQueue

pytestmark = [pytest.mark.timeout(300), pytest.mark.airflow]  # the matrix venvs have no Airflow


def _airflow(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, (args, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


@pytest.fixture(scope="module")
def metadata_db_home(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A private AIRFLOW_HOME with a migrated sqlite metadata database and no AIRFLOW_CONN_*."""
    home = tmp_path_factory.mktemp("airflow-home-db")
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("AIRFLOW_CONN_")}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW__CORE__LOAD_EXAMPLES="False")
    _airflow(env, "db", "migrate")
    return env


def test_worker_reads_a_connection_made_with_airflow_connections_add(
    start_worker, metadata_db_home: dict[str, str], redis_url: str, queue_name: str
) -> None:
    parsed = redis.connection.parse_url(redis_url)
    _airflow(
        metadata_db_home,
        "connections",
        "add",
        "chasqui_ui_made",
        "--conn-type",
        "chasqui",
        "--conn-host",
        str(parsed.get("host", "127.0.0.1")),
        "--conn-port",
        str(parsed.get("port", 6379)),
        "--conn-extra",
        f'{{"db": {parsed.get("db", 0)}, "default_queue": "{queue_name}"}}',
    )
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("echo", "from the metadata database")
        proc = start_worker(
            ["--conn-id", "chasqui_ui_made", "-H", "worker_handlers", "--max-jobs", "1", "--no-scheduler"],
            env=metadata_db_home,
        )
        assert proc.wait_exit(180) == 0, proc.output()[-4000:]
        assert q.get_job_result(job.id) == {"echo": "from the metadata database"}
    assert f"consuming {queue_name}" in proc.output()


def test_a_token_server_through_the_configured_credential_provider(
    start_worker, metadata_db_home: dict[str, str], tmp_path: Path, queue_name: str
) -> None:
    """A connection without a password to a server that refuses everyone without AUTH: with
    Airflow's ``[chasqui] credential_provider`` set, ``chasqui worker --conn-id`` authenticates
    with the provider's tokens, as the tasks and the triggerer do (SECURITY.md, "Token
    credentials"); without it, the worker cannot read the queue."""
    (tmp_path / "tokmod.py").write_text("async def provider(endpoint):\n    return 'chasqui', 'tok-1'\n")
    server = start_auth_server(tmp_path / "auth")
    try:
        _airflow(
            metadata_db_home,
            "connections",
            "add",
            "chasqui_tokens",
            "--conn-type",
            "chasqui",
            "--conn-host",
            "127.0.0.1",
            "--conn-port",
            str(server.port),
            "--conn-extra",
            f'{{"default_queue": "{queue_name}"}}',
        )
        with SyncQueue(
            queue_name, redis_url=server.url, credential_provider=lambda endpoint: ("chasqui", "tok-1")
        ) as q:
            jobs = q.add_bulk([{"name": "echo", "data": i} for i in range(2)])
            args = ["--conn-id", "chasqui_tokens", "-H", "worker_handlers", "--max-jobs", "2", "--no-scheduler"]
            path = os.pathsep.join([str(tmp_path), metadata_db_home.get("PYTHONPATH", "")])
            plain_env = {**metadata_db_home, "PYTHONPATH": path}
            unconfigured = start_worker([*args, "--reconnect-max-attempts", "2"], env=plain_env)
            assert unconfigured.wait_exit(180) != 0, unconfigured.output()[-4000:]
            assert "Authentication required" in unconfigured.output(), unconfigured.output()[-4000:]
            proc = start_worker(args, env={**plain_env, "AIRFLOW__CHASQUI__CREDENTIAL_PROVIDER": "tokmod:provider"})
            assert proc.wait_exit(180) == 0, proc.output()[-4000:]
            assert [q.get_job_result(j.id) for j in jobs] == [{"echo": 0}, {"echo": 1}]
    finally:
        server.stop()


def test_a_missing_connection_says_where_it_was_looked_for(metadata_db_home: dict[str, str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_provider_chasqui.cli",
            "worker",
            "--conn-id",
            "no_such_chasqui_conn",
            "-H",
            "worker_handlers",
        ],
        env=metadata_db_home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr
    assert "no_such_chasqui_conn" in err
    assert "AIRFLOW_CONN_NO_SUCH_CHASQUI_CONN" in err and "metadata database" in err, err[-2000:]


def test_operator_commands_read_it_too_and_keep_stdout_clean(
    metadata_db_home: dict[str, str], redis_url: str, queue_name: str
) -> None:
    """``chasqui dlq peek --json --conn-id`` on a metadata-database connection: airflow-core's
    own warnings go to stderr, so stdout stays the JSON a script parses."""
    parsed = redis.connection.parse_url(redis_url)
    _airflow(
        metadata_db_home,
        "connections",
        "add",
        "chasqui_ops_db",
        "--conn-type",
        "chasqui",
        "--conn-host",
        str(parsed.get("host", "127.0.0.1")),
        "--conn-port",
        str(parsed.get("port", 6379)),
        "--conn-extra",
        f'{{"db": {parsed.get("db", 0)}}}',
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_provider_chasqui.cli",
            "dlq",
            "peek",
            queue_name,
            "--json",
            "--conn-id",
            "chasqui_ops_db",
        ],
        env=metadata_db_home,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout) == []
