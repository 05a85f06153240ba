"""Token credentials from Airflow's configuration: ``[chasqui] credential_provider`` names an
``async def provider(endpoint) -> (username, password)`` that the hook's queues (tasks), the
triggers (the triggerer), the dashboard plugin and ``chasqui`` commands given ``--conn-id``
authenticate with, on a server that refuses everyone without AUTH.  A connection never names code (SECURITY.md, "Token
credentials"); ``tests/worker/test_worker_conn_id_db.py`` runs the worker's side."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from airflow_support import run_dags
from servers import start_auth_server

from airflow_provider_chasqui import ChasquiConnectionError, ConfigError, SyncQueue
from airflow_provider_chasqui.hooks.chasqui import ChasquiHook

pytestmark = pytest.mark.timeout(400)

TOKMOD = """
asked = []


async def provider(endpoint):
    asked.append(endpoint)
    return "chasqui", "tok-1"


def refuses(endpoint):
    raise RuntimeError("must not be asked")


NOT_CALLABLE = 3


def square(job):
    return {"x": job.data["x"], "square": job.data["x"] ** 2}
"""


def use(monkeypatch: pytest.MonkeyPatch, conn_id: str, value: dict) -> ChasquiHook:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(value))
    return ChasquiHook(conn_id)


def test_configured_credential_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[chasqui] credential_provider`` (Airflow's configuration, never the connection): the
    hook's blocking and asyncio queues (tasks, triggers) authenticate with its tokens on a
    server that refuses everyone else; a connection with its own password keeps it; a setting
    that names nothing usable is a ConfigError naming the option."""
    (tmp_path / "tokmod.py").write_text(TOKMOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    server = start_auth_server(tmp_path / "auth")
    try:
        conn = {"conn_type": "chasqui", "host": "127.0.0.1", "port": server.port}
        with use(monkeypatch, "tok_none", conn).get_queue("tok-q") as queue, pytest.raises(ChasquiConnectionError):
            queue.add("square", {"x": 0})  # no provider configured: refused (NOAUTH)

        monkeypatch.setenv("AIRFLOW__CHASQUI__CREDENTIAL_PROVIDER", "tokmod:provider")
        hook = use(monkeypatch, "tok", {**conn, "extra": {"db": 1}})  # another URL: none registered for it yet
        with hook.get_queue("tok-q") as queue:
            job = queue.add("square", {"x": 1})

        async def add_async() -> str:  # the triggers' side, on a URL (db 3) the blocking queue did not register
            async with await use(monkeypatch, "tok_async", {**conn, "extra": {"db": 3}}).aget_queue("tok-q") as q:
                return (await q.add("square", {"x": 2})).id

        second = asyncio.run(add_async())
        import tokmod

        assert tokmod.asked and set(tokmod.asked) == {f"127.0.0.1:{server.port}"}
        for db in (1, 3):
            with redis.Redis(port=server.port, password=server.admin_password, db=db) as admin:
                assert admin.xlen("{chasqui:tok-q}:stream") == 1, db

        monkeypatch.setenv("AIRFLOW__CHASQUI__CREDENTIAL_PROVIDER", "tokmod:refuses")  # own password: not asked
        own = use(monkeypatch, "tok_own", {**conn, "login": "chasqui", "password": "tok-1", "extra": {"db": 2}})
        with own.get_queue("tok-q") as queue:
            queue.add("square", {"x": 3})

        for spec, words in [
            ("tokmod:nothing", "has no attribute 'nothing'"),
            ("tokmod:NOT_CALLABLE", "is a int, not a credential provider"),
            ("no_such_tokmod:provider", "importing no_such_tokmod failed"),
            ("tokmod", "must name an object: pkg.module:attr"),
        ]:
            monkeypatch.setenv("AIRFLOW__CHASQUI__CREDENTIAL_PROVIDER", spec)
            with pytest.raises(
                ConfigError, match=re.escape(f"[chasqui] credential_provider {spec!r}") + ".*" + re.escape(words)
            ):
                hook.get_queue("tok-q")
        assert job.id and second
    finally:
        server.stop()


def test_a_dag_run_with_deferred_waits_reaches_a_token_server(airflow_home: dict[str, str], tmp_path: Path) -> None:
    """The connection carries no password; the deployment sets
    ``AIRFLOW__CHASQUI__CREDENTIAL_PROVIDER``.  ``dag.test()`` enqueues in the task and waits in
    the trigger, both through the provider; the worker is a real ``chasqui worker
    --credential-provider`` process.  The connection is an ``AIRFLOW_CONN_*`` variable here:
    ``dag.test()`` runs triggers in line, where Airflow 3 finds no metadata-database connection
    (a real triggerer does); the worker's test makes its connection with ``airflow connections
    add``."""
    (tmp_path / "tokmod.py").write_text(TOKMOD)
    queue, conn_id = f"t-tokens-{uuid.uuid4().hex[:6]}", f"chasqui_tokens_{uuid.uuid4().hex[:6]}"
    server = start_auth_server(tmp_path / "auth")
    path = os.pathsep.join(p for p in (str(tmp_path), airflow_home.get("PYTHONPATH", "")) if p)
    conn = {"conn_type": "chasqui", "host": "127.0.0.1", "port": server.port}  # no login, no password
    env = {
        **airflow_home,
        "PYTHONPATH": path,
        "AIRFLOW__CHASQUI__CREDENTIAL_PROVIDER": "tokmod:provider",
        f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(conn),
    }
    worker = None
    try:
        with open(tmp_path / "worker.log", "wb") as log:
            command = [sys.executable, "-m", "airflow_provider_chasqui.cli", "worker", "--redis-url", server.url]
            command += ["--queue", queue, "--handlers", "tokmod:square", "--credential-provider", "tokmod:provider"]
            worker = subprocess.Popen([*command, "--no-scheduler"], env=env, stdout=log, stderr=subprocess.STDOUT)
        [run] = run_dags(env, [["chasqui_token_auth", {"queue": queue, "conn_id": conn_id}]])
    finally:
        if worker is not None:
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(30)
        server.stop()
    assert run["state"] == "success", (run["tis"], run["log"][-4000:], (tmp_path / "worker.log").read_text()[-3000:])
    assert run["xcom"]["wait_here.return_value"] == {"x": 5, "square": 25}
    assert run["xcom"]["sense.return_value"] == {"x": 6, "square": 36}
    assert run["log"].count("[DAG TEST] Trigger completed") >= 2, run["log"][-4000:]


def test_the_dashboard_plugin_reads_a_token_server(
    airflow_home: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dashboard inside Airflow (``AirflowSources``: the metadata database's connections)
    reads a token server through the configured provider: a queue's counts, as its page shows."""
    from airflow_provider_chasqui.dashboard.plugin import AirflowSources

    (tmp_path / "tokmod.py").write_text(TOKMOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("AIRFLOW__CHASQUI__CREDENTIAL_PROVIDER", "tokmod:provider")
    conn_id, queue = f"chasqui_dash_tokens_{uuid.uuid4().hex[:6]}", f"t-dash-{uuid.uuid4().hex[:6]}"
    server = start_auth_server(tmp_path / "auth")
    try:
        add = ["connections", "add", conn_id, "--conn-type", "chasqui", "--conn-host", "127.0.0.1"]
        proc = subprocess.run(
            [sys.executable, "-m", "airflow", *add, "--conn-port", str(server.port)],
            env=airflow_home,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        own_password = server.url.replace("redis://", "redis://chasqui:tok-1@")  # registers no provider
        with SyncQueue(queue, redis_url=own_password) as q:
            q.add_bulk([{"name": "square", "data": {"x": i}} for i in range(3)])
        sources = AirflowSources()
        try:
            assert conn_id in sources.labels()
            assert sources.get(conn_id).queue(queue).get_job_counts("waiting") == {"waiting": 3}
        finally:
            sources.close()
    finally:
        server.stop()
