"""``docker-compose.yaml``: validated by the Compose client when this machine has one (no Docker
engine runs here), and always checked structurally with PyYAML: the services exist, and the
worker commands, queues, handlers, Redis and shared data are wired to each other.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from airflow_provider_chasqui.worker.cli import build_parser
from airflow_provider_chasqui.worker.registry import load_handlers

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
AIRFLOW_SERVICES = {"airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
                    "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer"}


def _compose_client() -> list[str] | None:
    """``docker compose`` (v2 plugin) if it answers, else ``docker-compose`` (v1), else None."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_the_compose_client_accepts_the_file(record_property: pytest.RecordProperty) -> None:
    client = _compose_client()
    if client is None:
        record_property("compose_validator", "pyyaml-only")
        print("\ncompose validation: no Compose client on this machine; structural checks only")
        return
    version = subprocess.run([*client, "version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    proc = subprocess.run([*client, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=60,
                          cwd=str(ROOT))
    record_property("compose_validator", f"{' '.join(client)} config ({version})")
    print(f"\ncompose validation: `{' '.join(client)} config -q` with {version}: exit {proc.returncode}")
    assert proc.returncode == 0, proc.stderr


def test_services_and_images(compose: dict) -> None:
    services = compose["services"]
    assert {"redis", "chasqui-worker", "spark-worker", *AIRFLOW_SERVICES} <= set(services)
    assert services["redis"]["image"].startswith("redis:8")
    for name, subcommand in AIRFLOW_SERVICES.items():
        svc = services[name]
        assert svc["command"][0] == subcommand, name
        assert svc["image"] == "airflow-provider-chasqui:dev" and svc["build"]["dockerfile"] == "docker/Dockerfile"
        assert svc["depends_on"]["redis"]["condition"] == "service_healthy"
        assert svc["depends_on"]["airflow-init"]["condition"] == "service_completed_successfully"
        assert "healthcheck" in svc
    dockerfile = (ROOT / services["airflow-scheduler"]["build"]["dockerfile"]).read_text()
    assert "FROM ${AIRFLOW_IMAGE}" in dockerfile and "apache/airflow:3.3" in dockerfile
    assert "openjdk-17" in dockerfile and "/opt/airflow/chasqui_spark_worker.py" in dockerfile


def _worker_args(command: list[str], marker: str) -> list[str]:
    return command[command.index(marker) + 1:]


def test_workers_are_wired_to_redis_airflow_and_each_other(compose: dict) -> None:
    services = compose["services"]
    env = services["airflow-scheduler"]["environment"]
    assert '"host": "redis"' in env["AIRFLOW_CONN_CHASQUI_DEFAULT"]

    chasqui = services["chasqui-worker"]["command"]
    assert chasqui[:2] == ["chasqui", "worker"]
    args = build_parser().parse_args(chasqui[2:])
    assert args.redis_url == "redis://redis:6379/0" and args.metrics_port == 9464
    assert args.queue == "chasqui-examples"  # the example DAGs' default queue param
    assert "chasqui-examples" in (ROOT / "example_dags" / "enqueue_and_wait.py").read_text()
    assert len(load_handlers(args.handlers)) > 0

    spark = services["spark-worker"]["command"]
    assert spark[:3] == ["spark-submit", "--master", "local[2]"]
    entry = next(a for a in spark if a.endswith(".py"))
    assert entry == "/opt/airflow/chasqui_spark_worker.py"
    sargs = build_parser(spark=True).parse_args(_worker_args(spark, entry))
    assert sargs.redis_url == "redis://redis:6379/0" and sargs.queue == env["CHASQUI_SPARK_QUEUE"]
    assert "sales_rollup" in load_handlers(sargs.handlers)
    assert sargs.shutdown_deadline < int(services["spark-worker"]["stop_grace_period"].rstrip("s"))
    # Signals reach the workers (not an `airflow` wrapper), and Spark output lands where Airflow reads it.
    for name in ("chasqui-worker", "spark-worker"):
        assert services[name]["entrypoint"] == ["/usr/bin/dumb-init", "--"]
        health = " ".join(services[name]["healthcheck"]["test"])
        port = (args if name == "chasqui-worker" else sargs).metrics_port
        assert f"127.0.0.1:{port}/healthz" in health
    assert "chasqui-data:/data" in services["spark-worker"]["volumes"]
    assert "chasqui-data:/data" in services["airflow-scheduler"]["volumes"]
    assert env["CHASQUI_DATA_DIR"] == "/data"
    assert "./example_dags:/opt/airflow/dags:ro" in services["airflow-scheduler"]["volumes"]
