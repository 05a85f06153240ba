"""Secrets never printed: every URL a message, log line or error shows goes through
``core.urls.redact_url`` / ``redact_text``, and every ``chasqui`` command takes its URL from the
environment (or an Airflow connection) so the password need not sit in argv.

The CLI tests run the real command against unreachable plain, Sentinel and Cluster URLs (a
connection error is where the URL used to be printed whole) and a real server that refuses the
password; the in-process ones check exceptions and log records (caplog)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from servers import free_port, start_server

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.urls import REDACTED, redact_text, redact_url
from airflow_provider_chasqui.engine.scheduler import run_standalone
from airflow_provider_chasqui.errors import ChasquiConnectionError

HOSTILE = "p@ss:w/rd%40x@"  # unescaped @ : / and a percent escape, as people paste them


def _urls(password: str, port: int) -> dict[str, str]:
    q = quote(password, safe="")
    return {
        "plain": f"redis://app:{q}@127.0.0.1:{port}/0",
        "plain-raw": f"redis://app:{password}@127.0.0.1:{port}/0",
        "sentinel": f"redis+sentinel://:{q}@127.0.0.1:{port}/svc/0?sentinel_password={q}&socket_timeout=2",
        "cluster": f"redis://:{q}@127.0.0.1:{port}/0?cluster=true&password={q}",
    }


def _leaks(text: str, password: str) -> list[str]:
    forms = {password, quote(password, safe=""), quote(password)}
    return [f for f in forms if f in text]


def chasqui(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=full,
    )


# ---- the helper --------------------------------------------------------------------------
_PASSWORD = st.text(alphabet=st.sampled_from("abcXYZ019@:%/+=&!$*_-."), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(password=_PASSWORD, user=st.sampled_from(["", "app", "default"]))
def test_redact_url_hides_hostile_passwords_exactly(password: str, user: str) -> None:
    raw = f"redis://{user}:{password}@h1:6379/2"
    assert redact_url(raw) == f"redis://{user}:{REDACTED}@h1:6379/2"
    q = quote(password, safe="")
    sentinel = f"rediss+sentinel://{user}:{q}@s1:26379,[::1]:26380/svc/0?socket_timeout=3&sentinel_password={q}"
    assert redact_url(sentinel) == (
        f"rediss+sentinel://{user}:{REDACTED}@s1:26379,[::1]:26380/svc/0?socket_timeout=3&sentinel_password={REDACTED}"
    )
    query = f"redis://h/0?cluster=true&ssl_password={q}&password={q}&auth_token={q};client_secret={q}"
    assert redact_url(query) == (
        f"redis://h/0?cluster=true&ssl_password={REDACTED}&password={REDACTED}"
        f"&auth_token={REDACTED};client_secret={REDACTED}"
    )
    text = redact_text(f"cannot reach {raw} (Connection(host=h1,password={q},db=2)) or '{sentinel}'")
    assert text == (
        f"cannot reach {redact_url(raw)} (Connection(host=h1,password={REDACTED},db=2)) or '{redact_url(sentinel)}'"
    )


def test_redact_url_keeps_what_is_not_secret() -> None:
    assert redact_url("redis://127.0.0.1:6379/0?cluster=true") == "redis://127.0.0.1:6379/0?cluster=true"
    assert redact_url("redis://alice@h/0") == f"redis://{REDACTED}@h/0"  # a lone userinfo may be a password
    assert redact_url(None) == "None"
    assert (
        redact_text("AUTH <password> called without any password configured")
        == "AUTH <password> called without any password configured"
    )


# ---- the real command ----------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["plain", "plain-raw", "sentinel", "cluster"])
@pytest.mark.parametrize("how", ["argv", "env"])
def test_unreachable_url_is_reported_without_its_password(kind: str, how: str) -> None:
    url = _urls(HOSTILE, free_port())[kind]
    args, env = (["--redis-url", url], None) if how == "argv" else ([], {"CHASQUI_REDIS_URL": url})
    proc = chasqui("inspect", "q", *args, env=env)
    if kind == "plain-raw":  # an unescaped '/' ends the authority: redis-py would read a bad port
        assert proc.returncode == 2 and "not a valid Redis URL" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 3 and "unreachable" in proc.stderr, proc.stderr
    assert "127.0.0.1" in proc.stderr and REDACTED in proc.stderr
    assert not _leaks(proc.stdout + proc.stderr, HOSTILE), proc.stderr


def test_wrong_password_on_a_real_server_is_not_echoed(tmp_path) -> None:
    server = start_server("redis7", tmpdir=tmp_path)
    try:
        with server.client() as r:
            r.config_set("requirepass", "the-right-one")
        url = f"redis://:{quote(HOSTILE, safe='')}@127.0.0.1:{server.port}/0"
        proc = chasqui("dlq", "peek", "q", env={"CHASQUI_REDIS_URL": url})
        assert proc.returncode in (1, 3), proc.stderr
        assert proc.stderr.startswith("chasqui: ") and not _leaks(proc.stdout + proc.stderr, HOSTILE), proc.stderr
        ok = chasqui(
            "dlq", "peek", "q", "--json", env={"CHASQUI_REDIS_URL": f"redis://:the-right-one@127.0.0.1:{server.port}/0"}
        )
        assert ok.returncode == 0 and ok.stdout.strip() == "[]", ok.stderr
    finally:
        server.stop()


@pytest.mark.timeout(300)
@pytest.mark.airflow  # needs Airflow: the matrix venvs deselect it
def test_conn_id_reads_redis_from_an_airflow_connection(tmp_path) -> None:
    """``--conn-id`` on the operator commands: the password lives in the connection, not in argv."""
    import json

    server = start_server("redis7", tmpdir=tmp_path)
    try:
        with server.client() as r:
            r.config_set("requirepass", HOSTILE)
            r.auth(HOSTILE)
            r.xadd("{chasqui:cq}:dlq", {"d": b"\xc1", "reason": "malformed"})

        def conn(password: str) -> str:
            return json.dumps(
                {
                    "conn_type": "chasqui",
                    "host": "127.0.0.1",
                    "port": server.port,
                    "password": password,
                    "extra": {"db": 0},
                }
            )

        env = {
            "AIRFLOW_HOME": str(tmp_path / "af"),
            "AIRFLOW_CONN_CHASQUI_OPS_TEST": conn(HOSTILE),
            "AIRFLOW_CONN_CHASQUI_OPS_WRONG": conn(HOSTILE + "x"),
        }
        ok = chasqui("dlq", "peek", "cq", "--json", "--conn-id", "chasqui_ops_test", env=env)
        assert ok.returncode == 0 and [e["reason"] for e in json.loads(ok.stdout)] == ["malformed"], ok.stderr
        wrong = chasqui("inspect", "cq", "--conn-id", "chasqui_ops_wrong", env=env)
        assert wrong.returncode in (1, 3) and wrong.stderr.startswith("chasqui: "), wrong.stderr
        assert not _leaks(wrong.stdout + wrong.stderr, HOSTILE), wrong.stderr
        missing = chasqui("inspect", "cq", "--conn-id", "no_such_conn_ops", env=env)
        assert missing.returncode == 2 and "no_such_conn_ops" in missing.stderr, missing.stderr
    finally:
        server.stop()


def test_env_url_is_used_and_argv_wins(redis_url: str, queue_name: str) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.add("x", 1)
    from_env = chasqui("inspect", queue_name, "--json", env={"CHASQUI_REDIS_URL": redis_url})
    assert from_env.returncode == 0 and '"stream": 1' in from_env.stdout, from_env.stderr
    argv_wins = chasqui("inspect", queue_name, "--json", "--redis-url", dead, env={"CHASQUI_REDIS_URL": redis_url})
    assert argv_wins.returncode == 3
    both = chasqui("inspect", queue_name, "--redis-url", redis_url, "--conn-id", "x")
    assert both.returncode == 2 and "not allowed with" in both.stderr


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", ["sentinel", "cluster"])
def test_worker_logs_hold_no_password(kind: str, tmp_path) -> None:
    """``chasqui worker`` retrying an unreachable Redis logs each failure; none shows the password."""
    import signal
    import time

    url = _urls(HOSTILE, free_port())[kind]
    log_path = tmp_path / "worker.log"
    handlers = tmp_path / "secret_test_handlers.py"
    handlers.write_text("HANDLERS = {'noop': lambda job: None}\n")
    env = dict(os.environ, CHASQUI_REDIS_URL=url, PYTHONPATH=f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airflow_provider_chasqui.cli",
                "worker",
                "-q",
                "q",
                "-H",
                "secret_test_handlers",
                "--metrics-port",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 120
        while "Redis unavailable" not in log_path.read_text() or "depth sample failed" not in log_path.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(60)
    out = log_path.read_text()
    assert "127.0.0.1" in out and not _leaks(out, HOSTILE), out


def test_worker_refuses_an_unparsable_url_without_quoting_it() -> None:
    url = f"redis://app:{HOSTILE}@127.0.0.1:{free_port()}/0"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_provider_chasqui.cli",
            "worker",
            "-q",
            "q",
            "-H",
            "airflow_provider_chasqui.examples.handlers",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env=dict(os.environ, CHASQUI_REDIS_URL=url),
    )
    assert proc.returncode == 2 and "not a valid Redis URL" in proc.stderr, proc.stderr
    assert not _leaks(proc.stdout + proc.stderr, HOSTILE) and "rd%40x" not in proc.stderr, proc.stderr


def test_version_from_package_metadata() -> None:
    from importlib.metadata import version

    want = version("airflow-provider-chasqui")
    for args, prog in ((["--version"], "chasqui"), (["worker", "--version"], "chasqui worker")):
        proc = subprocess.run(
            [sys.executable, "-m", "airflow_provider_chasqui.cli", *args], capture_output=True, text=True, timeout=60
        )
        assert (proc.returncode, proc.stdout) == (0, f"{prog} {want}\n"), proc.stderr


# ---- in process: exceptions and log records ------------------------------------------------------
@pytest.mark.parametrize("kind", ["plain", "sentinel", "cluster"])
def test_connection_errors_and_logs_hold_no_password(kind: str, caplog: pytest.LogCaptureFixture) -> None:
    url = _urls(HOSTILE, free_port())[kind]
    caplog.set_level(logging.DEBUG)
    with pytest.raises(ChasquiConnectionError) as info, SyncQueue("q", redis_url=url) as q:
        q.add("x", 1)
    shown = "".join([str(info.value), repr(info.value), caplog.text])
    assert not _leaks(shown, HOSTILE), shown


def test_standalone_scheduler_logs_no_sentinel_password(caplog: pytest.LogCaptureFixture) -> None:
    """The issue's reproduction: the INFO line printed ``?sentinel_password=...`` whole."""
    url = _urls(HOSTILE, free_port())["sentinel"]
    caplog.set_level(logging.DEBUG, logger="airflow_provider_chasqui")

    async def run() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(run_standalone(["q"], url, promoter=True, tick_ms=50, poll_ms=50, stop=stop))
        deadline = asyncio.get_running_loop().time() + 60
        while "standalone" not in caplog.text or "q" not in caplog.text:
            assert asyncio.get_running_loop().time() < deadline, caplog.text
            await asyncio.sleep(0.02)
        stop.set()
        await asyncio.wait_for(task, 60)

    asyncio.run(run())
    assert "sentinel_password=***" in caplog.text
    assert not _leaks(caplog.text, HOSTILE), caplog.text
