"""Fixtures of the Spark suite: one in-process SparkSession (``local[2]``) for the whole session.

PySpark is imported only here and in these tests, so the rest of the suite never pays for it.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from servers import free_port

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, as scripts/test.sh sets it


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    with warnings.catch_warnings():
        # pyspark 4.3 warns that it does not yet fully support pandas 3 (installed by the Spark provider).
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\..*")
        from pyspark.sql import SparkSession

        session = (
            SparkSession.builder.master("local[2]")
            .appName("chasqui-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "4")
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    # py4j logs "Closing down clientserver connection" at INFO from a __del__ at interpreter
    # exit, when the stream a test harness's handler wrote to is closed: a "Logging error" trace
    logging.getLogger("py4j").setLevel(logging.WARNING)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Spark Connect server from the pyspark wheel (``sbin/start-connect-server.sh --wait``,
    local[2], a free port on loopback), stopped by its process group; yields ``sc://...``."""
    import importlib
    import signal
    import socket
    import subprocess
    import sys
    import time
    from pathlib import Path

    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    script = home / "sbin" / "start-connect-server.sh"
    if not script.exists() or not list((home / "jars").glob("spark-connect_*.jar")):
        pytest.fail(
            f"this pyspark ({home}) ships no Spark Connect server (sbin/start-connect-server.sh and "
            "jars/spark-connect_*.jar): install pyspark, not only pyspark-client"
        )
    for module in ("grpc", "grpc_status", "google.rpc.status_pb2", "zstandard", "pyarrow", "pandas"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            pytest.fail(f"Spark Connect's client needs {module} (pyspark[connect]): {exc}")
    port = free_port()
    logs = tmp_path_factory.mktemp("spark-connect")
    root = str(Path(__file__).resolve().parents[2])
    env = dict(
        os.environ,
        SPARK_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOG_DIR=str(logs),
        SPARK_PID_DIR=str(logs),
        PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
    )
    log = open(logs / "server.log", "wb")  # noqa: SIM115 - closed at teardown
    proc = subprocess.Popen(
        [
            "bash",
            str(script),
            "--wait",
            "--master",
            "local[2]",
            "--conf",
            f"spark.connect.grpc.binding.port={port}",
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=4",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"the Spark Connect server exited ({proc.returncode}):\n"
                    + (logs / "server.log").read_text(errors="replace")[-3000:]
                )
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(
                        "the Spark Connect server did not listen within 300 s:\n"
                        + (logs / "server.log").read_text(errors="replace")[-3000:]
                    )
                time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        except ProcessLookupError:
            pass
        log.close()


_CONNECT_ENV = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")


@pytest.fixture(scope="session")
def _spark_connect_session(spark_connect_url: str) -> Iterator[tuple[Any, dict[str, str]]]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\..*")
        from pyspark.sql import SparkSession

        session = SparkSession.builder.remote(spark_connect_url).create()
    # builder.remote() marks the whole process as a Connect client in os.environ; keep that to the
    # tests that use this session, or classic sessions and spark-submit children would refuse to start.
    marks = {k: os.environ.pop(k) for k in _CONNECT_ENV if k in os.environ}
    from airflow_provider_chasqui.spark.datasource import register

    register(session)
    yield session, marks
    session.stop()


@pytest.fixture
def spark_connect(_spark_connect_session: tuple[Any, dict[str, str]], monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Spark Connect client session with ``format("chasqui")`` registered (session-wide)."""
    session, marks = _spark_connect_session
    for key, value in marks.items():
        monkeypatch.setenv(key, value)
    return session
