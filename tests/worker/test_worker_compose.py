"""``docker-compose.yaml`` without a Docker engine: the Compose client (``docker-compose config``,
installed by scripts/bootstrap.sh) interpolates the file with secrets from ``docker/make-env.sh``,
the static tests check what the file promises (required secrets, one set of Airflow keys,
healthchecks, dependencies, loopback ports, the Redis password in env only), and ``stack`` RUNS
every service's command line as a local process with the service's environment.

What the local run translates, and nothing else: service hostnames -> 127.0.0.1 and a free port
per container port (Postgres -> the machine's server on 127.0.0.1:5432, a fresh database);
volumes -> temp dirs (mounts under the image's ``/opt/airflow`` live in one shared Airflow home);
the images' entrypoints -> what they do (apache/airflow's ``/entrypoint`` runs ``airflow
<command>``, ``bash``/``python`` as given; ``dumb-init --`` only forwards signals; redis's
``docker-entrypoint.sh`` runs its arguments); bind-all addresses and ports a container binds by
default (Airflow's log servers) -> loopback and free ports, since all processes share one host.
Each service starts when its ``depends_on`` conditions hold and must pass its own healthcheck
command, run locally; the Postgres service itself is not started (the machine's server stands in).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
import yaml
from servers import free_port

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.worker.cli import build_parser
from airflow_provider_chasqui.worker.registry import load_handlers

pytestmark = pytest.mark.airflow  # Airflow services and its cryptography: the matrix venvs have neither

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yaml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
MAKE_ENV = ROOT / "docker" / "make-env.sh"
IMAGE = "airflow-provider-chasqui:dev"
IMAGE_HOME = "/opt/airflow"  # apache/airflow's AIRFLOW_HOME and WORKDIR
IMAGE_UID = 50000  # apache/airflow's `airflow` user, the USER of docker/Dockerfile
IMAGE_ENTRYPOINT = ["/usr/bin/dumb-init", "--", "/entrypoint"]  # apache/airflow's ENTRYPOINT
SECRETS = (
    "AIRFLOW_FERNET_KEY",
    "AIRFLOW_SECRET_KEY",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_ADMIN_PASSWORD",
    "REDIS_PASSWORD",
    "POSTGRES_PASSWORD",
)
AIRFLOW_KEYS = {
    "AIRFLOW__CORE__FERNET_KEY": "AIRFLOW_FERNET_KEY",
    "AIRFLOW__API__SECRET_KEY": "AIRFLOW_SECRET_KEY",
    "AIRFLOW__API_AUTH__JWT_SECRET": "AIRFLOW_JWT_SECRET",
}
AIRFLOW_SERVICES = {
    "airflow-apiserver": "api-server",
    "airflow-scheduler": "scheduler",
    "airflow-dag-processor": "dag-processor",
    "airflow-triggerer": "triggerer",
}
WORKERS = ("chasqui-worker", "spark-worker")


# ---- the Compose client ---------------------------------------------------------------------------
def _compose_client() -> list[str]:
    """``docker compose`` (v2 plugin) if it answers, else ``docker-compose`` (v1, from bootstrap.sh)."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    assert shutil.which("docker-compose"), "no Compose client: scripts/bootstrap.sh installs docker-compose"
    return ["docker-compose"]


def _compose(*args: str, env_file: Path) -> subprocess.CompletedProcess:
    """The client on our file, with no secret from this process's environment or a stray ./.env."""
    env = {k: v for k, v in os.environ.items() if k not in SECRETS}
    cmd = [*_compose_client(), "--env-file", str(env_file), "-f", str(COMPOSE), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(ROOT), env=env)


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compose-env") / ".env"
    proc = subprocess.run(["sh", str(MAKE_ENV), str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return path


@pytest.fixture(scope="module")
def secrets(env_file: Path) -> dict[str, str]:
    return _env_file(env_file)


@pytest.fixture(scope="module")
def config(env_file: Path) -> dict:
    """``docker compose config``: the file as the engine would get it (anchors merged, variables set)."""
    proc = _compose("config", env_file=env_file)
    assert proc.returncode == 0, proc.stderr
    return yaml.safe_load(proc.stdout)


def _argv(value: str | list[str] | None) -> list[str]:
    """A command or entrypoint as the container gets it (``config`` prints ``$`` as ``$$``)."""
    return [a.replace("$$", "$") for a in (shlex.split(value) if isinstance(value, str) else list(value or []))]


def _ports(svc: dict) -> list[tuple[str, int, int]]:
    """``(host_ip, published, container)`` of each published port (v1 strings or v2 mappings)."""
    out = []
    for p in svc.get("ports", []):
        if isinstance(p, dict):
            out.append((p.get("host_ip", ""), int(p["published"]), int(p["target"])))
        else:
            parts = str(p).split("/")[0].split(":")
            assert len(parts) == 3, f"port {p!r} names no host address"
            out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def _mounts(svc: dict) -> list[tuple[str, str]]:
    """``(source, target)`` of each volume (v1 ``src:dst[:mode]`` strings or v2 mappings)."""
    out = []
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            out.append((v["source"], v["target"]))
        else:
            src, dst = v.split(":")[:2]
            out.append((src, dst))
    return out


def _seconds(value: str | int | float) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)(ms|s|m|h)", value))


# ---- what the file promises ------------------------------------------------------------------------
def test_make_env_writes_fresh_private_secrets_and_never_overwrites(
    env_file: Path, secrets: dict[str, str], tmp_path: Path
) -> None:
    from cryptography.fernet import Fernet

    assert set(secrets) == set(SECRETS) and all(secrets.values())
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    Fernet(secrets["AIRFLOW_FERNET_KEY"].encode())  # a valid key, or this raises
    for name in ("REDIS_PASSWORD", "POSTGRES_PASSWORD"):  # they go into URLs unescaped
        assert re.fullmatch(r"[0-9a-f]{32,}", secrets[name]), name
    other = tmp_path / ".env"
    assert subprocess.run(["sh", str(MAKE_ENV), str(other)], capture_output=True, timeout=60).returncode == 0
    assert not set(_env_file(other).values()) & set(secrets.values())  # fresh values every time
    before = other.read_text()
    again = subprocess.run(["sh", str(MAKE_ENV), str(other)], capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "not overwriting" in again.stderr and other.read_text() == before
    example = (ROOT / ".env.example").read_text()
    assert all(f"\n{name}=\n" in example for name in SECRETS)  # documented, with no value
    assert (
        ".env" in (ROOT / ".gitignore").read_text().split() and ".env" in (ROOT / ".dockerignore").read_text().split()
    )


@pytest.mark.parametrize("missing", SECRETS)
def test_every_secret_is_required(missing: str, env_file: Path, tmp_path: Path) -> None:
    partial = tmp_path / ".env"
    partial.write_text("".join(f"{k}={v}\n" for k, v in _env_file(env_file).items() if k != missing))
    proc = _compose("config", "-q", env_file=partial)
    assert proc.returncode != 0 and f"set {missing} (run: sh docker/make-env.sh)" in proc.stderr, proc.stderr


def test_no_secret_has_a_default_or_a_literal_in_the_file() -> None:
    text = COMPOSE.read_text()
    for name in SECRETS:
        uses = re.findall(r"\$\{" + name + r"([^}]*)\}", text)
        assert uses and all(u.startswith(":?") for u in uses), (name, uses)
    for key in AIRFLOW_KEYS:  # set once, in the x-airflow-env anchor every Airflow service merges
        assert len(re.findall(rf"^\s+{key}:", text, re.M)) == 1, key


def test_airflow_services_share_one_set_of_keys(config: dict, secrets: dict[str, str]) -> None:
    services = config["services"]
    airflow = [n for n, s in services.items() if s.get("image") == IMAGE and n not in WORKERS]
    assert set(airflow) == {"airflow-init", *AIRFLOW_SERVICES}
    for name in airflow:
        env = services[name]["environment"]
        for key, var in AIRFLOW_KEYS.items():
            assert env[key] == secrets[var], (name, key)
        assert (
            env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
            == services["airflow-apiserver"]["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        )
        assert urlsplit(env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]).password == secrets["POSTGRES_PASSWORD"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == secrets["POSTGRES_PASSWORD"]


def test_healthchecks_dependencies_and_loopback_ports(config: dict) -> None:
    services = config["services"]
    for name, svc in services.items():
        if name == "airflow-init":
            assert "healthcheck" not in svc and "restart" not in svc  # a one-shot job
        else:
            assert svc["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL"), name
        for dep, cond in svc.get("depends_on", {}).items():
            wanted = "service_completed_successfully" if dep == "airflow-init" else "service_healthy"
            assert cond["condition"] == wanted, (name, dep)
        for host_ip, _published, _target in _ports(svc):
            assert host_ip == "127.0.0.1", (name, svc["ports"])
    for name, subcommand in AIRFLOW_SERVICES.items():
        svc = services[name]
        assert _argv(svc["command"])[0] == subcommand and "entrypoint" not in svc, name
        assert set(svc["depends_on"]) == {"redis", "postgres", "airflow-init"}, name
    assert set(services["airflow-init"]["depends_on"]) == {"postgres"}
    assert set(services["chasqui-worker"]["depends_on"]) == {"redis"}
    assert set(services["spark-worker"]["depends_on"]) == {"redis", "airflow-init"}  # /data is chowned first
    health = {n: " ".join(s["healthcheck"]["test"]) for n, s in services.items() if "healthcheck" in s}
    assert "/api/v2/monitor/health" in health["airflow-apiserver"]
    assert ":8974/health" in health["airflow-scheduler"]
    assert services["airflow-scheduler"]["environment"]["AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK"] == "True"
    assert "airflow jobs check --job-type DagProcessorJob" in health["airflow-dag-processor"]
    assert "airflow jobs check --job-type TriggererJob" in health["airflow-triggerer"]
    assert "redis-cli" in health["redis"] and "PONG" in health["redis"]


def test_redis_has_a_password_that_travels_in_env_only(config: dict, secrets: dict[str, str]) -> None:
    services = config["services"]
    password = secrets["REDIS_PASSWORD"]
    assert services["redis"]["environment"]["REDISCLI_AUTH"] == password
    assert "requirepass ${REDISCLI_AUTH}" in " ".join(_argv(services["redis"]["command"]))
    clients = 0
    for name, svc in services.items():
        argv = " ".join(
            _argv(svc.get("entrypoint")) + _argv(svc.get("command")) + svc.get("healthcheck", {}).get("test", [])
        )
        assert all(value not in argv for value in secrets.values()), f"{name}: a secret in argv"
        for key, value in svc.get("environment", {}).items():
            if "redis://" in value:
                assert urlsplit(value).password == password and urlsplit(value).hostname == "redis", (name, key)
                clients += 1
            if key == "AIRFLOW_CONN_CHASQUI_DEFAULT":
                conn = json.loads(value)
                assert (conn["host"], conn["port"], conn["password"]) == ("redis", 6379, password), name
    assert clients == 7  # the five Airflow services and the two workers


def test_workers_are_wired_to_redis_airflow_and_each_other(config: dict) -> None:
    services = config["services"]
    env = services["airflow-scheduler"]["environment"]
    chasqui = _argv(services["chasqui-worker"]["command"])
    assert chasqui[:2] == ["chasqui", "worker"]
    args = build_parser().parse_args(chasqui[2:])
    assert args.redis_url is None and args.conn_id is None  # CHASQUI_REDIS_URL, from the environment
    assert args.queue == "chasqui-examples"  # the example DAGs' default queue param
    assert "chasqui-examples" in (ROOT / "example_dags" / "enqueue_and_wait.py").read_text()
    assert len(load_handlers(args.handlers)) > 0

    spark = _argv(services["spark-worker"]["command"])
    assert spark[:3] == ["spark-submit", "--master", "local[2]"]
    entry = next(a for a in spark if a.endswith(".py"))
    assert entry == "/opt/airflow/chasqui_spark_worker.py" and entry in DOCKERFILE.read_text()
    sargs = build_parser(spark=True).parse_args(spark[spark.index(entry) + 1 :])
    assert sargs.redis_url is None and sargs.queue == env["CHASQUI_SPARK_QUEUE"]
    assert "sales_rollup" in load_handlers(sargs.handlers)
    assert sargs.shutdown_deadline < _seconds(services["spark-worker"]["stop_grace_period"])
    for name, parsed in (("chasqui-worker", args), ("spark-worker", sargs)):
        svc = services[name]
        assert _argv(svc["entrypoint"]) == ["/usr/bin/dumb-init", "--"]  # signals reach the worker itself
        assert parsed.metrics_host == "0.0.0.0"  # reachable from outside the container
        assert f"127.0.0.1:{parsed.metrics_port}/healthz" in " ".join(svc["healthcheck"]["test"])
        assert (parsed.metrics_port, parsed.metrics_port) in [(p, t) for _h, p, t in _ports(svc)]
        assert svc["environment"]["CHASQUI_REDIS_URL"] == env["CHASQUI_REDIS_URL"]
    # Spark output lands where Airflow's tasks read it.
    for name in ("spark-worker", "airflow-scheduler", "airflow-init"):
        assert ("chasqui-data", "/data") in _mounts(services[name]), name
    assert env["CHASQUI_DATA_DIR"] == "/data"
    assert (str(ROOT / "example_dags"), "/opt/airflow/dags") in _mounts(services["airflow-scheduler"])


def test_the_image_is_airflow_33_with_java_and_the_spark_entry() -> None:
    dockerfile = DOCKERFILE.read_text()
    assert "FROM ${AIRFLOW_IMAGE}" in dockerfile and "apache/airflow:3.3" in dockerfile
    assert "openjdk-17" in dockerfile and re.search(
        r"ln -s .*worker\.spark.*\n.*/opt/airflow/chasqui_spark_worker\.py", dockerfile
    )
    assert dockerfile.rstrip().splitlines()[-1] != "USER root" and "\nUSER airflow\n" in dockerfile


# ---- the local run ---------------------------------------------------------------------------------
def _psql(sql: str, database: str = "postgres") -> str:
    proc = subprocess.run(
        [
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            "5432",
            "-U",
            "postgres",
            "-d",
            database,
            "-At",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"PostgreSQL on 127.0.0.1:5432 (trust auth) is needed: {proc.stderr}"
    return proc.stdout


_AIRFLOW_SHIM = """#!/bin/sh
# apache/airflow's /entrypoint, what matters here: bash and python run as given, anything else
# (with or without a leading `airflow`) as `airflow <command>`
case "$1" in
  bash|python) cmd=$1; shift; exec "$cmd" "$@" ;;
  airflow) shift ;;
esac
exec airflow "$@"
"""
_REDIS_SHIM = """#!/bin/sh
# redis's docker-entrypoint.sh: drop to the redis user (no such step here), then run the arguments
exec "$@"
"""


@dataclass
class Service:
    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    health: list[str] | None
    health_timeout: float
    log: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    healthy_after: float | None = None
    checks: int = 0
    last_check: str = ""
    check_proc: subprocess.Popen | None = None
    check_started: float = 0.0
    done: bool = False
    notes: list[str] = field(default_factory=list)


class LocalStack:
    """The compose services as local processes, started in ``depends_on`` order."""

    def __init__(self, config: dict, tmp: Path) -> None:
        self.services = config["services"]
        self.tmp = tmp
        self.home = tmp / "opt-airflow"  # the image's /opt/airflow, one for every Airflow process
        self.shims = tmp / "shims"
        for d in (self.home, self.shims):
            d.mkdir()
        (self.shims / "entrypoint").write_text(_AIRFLOW_SHIM)
        (self.shims / "docker-entrypoint.sh").write_text(_REDIS_SHIM)
        for shim in self.shims.iterdir():
            shim.chmod(0o755)
        # docker/Dockerfile links the Spark worker's entry into /opt/airflow
        import airflow_provider_chasqui.worker.spark as spark_entry

        (self.home / "chasqui_spark_worker.py").symlink_to(spark_entry.__file__)
        self.database = f"chasqui_compose_{uuid.uuid4().hex[:8]}"
        self.ports: dict[tuple[str, int], int] = {("postgres", 5432): 5432}
        for name, svc in self.services.items():
            for port in self._container_ports(svc):
                self.ports.setdefault((name, port), free_port())
        self.volumes: dict[str, Path] = {}
        self.home_mounts: list[tuple[str, str]] = []
        self.mounts: dict[str, list[tuple[str, Path]]] = {n: self._mount(n, s) for n, s in self.services.items()}
        self.hostname = ""
        self.run: dict[str, Service] = {}

    # -- translation ----------------------------------------------------------------------------
    @staticmethod
    def _container_ports(svc: dict) -> set[int]:
        """The ports a container publishes or probes in its healthcheck."""
        probe = " ".join(svc.get("healthcheck", {}).get("test", []))
        return {target for _h, _p, target in _ports(svc)} | {
            int(p) for p in re.findall(r"(?:127\.0\.0\.1:|localhost:|redis-cli -p )(\d+)", probe)
        }

    def _is_airflow_image(self, name: str) -> bool:
        return self.services[name].get("image") == IMAGE

    def _mount(self, name: str, svc: dict) -> list[tuple[str, Path]]:
        out = []
        for src, target in _mounts(svc):
            if target.startswith(IMAGE_HOME + "/"):
                host = self.home / target[len(IMAGE_HOME) + 1 :]
            else:
                host = self.tmp / "volumes" / Path(src).name
            known = self.volumes.setdefault(src, host)
            assert known == host, f"volume {src} is mounted at two places; one Airflow home cannot share it"
            if not host.exists():
                if src.startswith("/"):  # a bind mount: a copy, so nothing writes into the repository
                    shutil.copytree(src, host, ignore=shutil.ignore_patterns("__pycache__"))
                else:
                    host.mkdir(parents=True)
            out.append((target, host))
        if self._is_airflow_image(name):
            out.append((IMAGE_HOME, self.home))
            # one home stands for every container's /opt/airflow: faithful only if those that
            # mount anything there mount the same things
            inside = sorted((t, str(h)) for t, h in out if t.startswith(IMAGE_HOME + "/"))
            if inside:
                self.home_mounts = self.home_mounts or inside
                assert inside == self.home_mounts, f"{name} mounts {inside}; another service {self.home_mounts}"
        out.append(("/entrypoint", self.shims / "entrypoint"))
        return sorted(out, key=lambda m: -len(m[0]))

    def translate(self, name: str, text: str) -> str:
        """One argv element, env value or script of service ``name``, as it runs on this host."""
        try:
            conn = json.loads(text)
        except ValueError:
            conn = None
        if isinstance(conn, dict) and (conn.get("host"), conn.get("port")) in self.ports:
            conn["port"] = self.ports[(conn["host"], conn["port"])]
            conn["host"] = "127.0.0.1"
            return json.dumps(conn)
        for (host, port), local in self.ports.items():
            text = re.sub(rf"(?<![\w.-]){re.escape(host)}:{port}(?!\d)", f"127.0.0.1:{local}", text)
            if host == name:  # its own ports: what it listens on and probes
                text = re.sub(rf"(?<![\w.]){port}(?![\w])", str(local), text)
        text = text.replace("0.0.0.0", "127.0.0.1")
        for target, host in self.mounts[name]:
            text = re.sub(rf"(?<![\w./-]){re.escape(target)}(?=[/\s\"':)]|$)", str(host), text)
        if text.startswith("postgresql"):
            parts = urlsplit(text)
            assert parts.hostname == "127.0.0.1" and parts.port == 5432, text
            text = urlunsplit(parts._replace(path=f"/{self.database}"))
        return text

    def argv(self, name: str) -> list[str]:
        svc = self.services[name]
        if "entrypoint" in svc:
            entry = _argv(svc["entrypoint"])
        else:
            entry = IMAGE_ENTRYPOINT if self._is_airflow_image(name) else ["docker-entrypoint.sh"]
        argv = entry + _argv(svc.get("command"))
        if argv[:2] == ["/usr/bin/dumb-init", "--"]:
            argv = argv[2:]
        return [self.translate(name, a) for a in argv]

    def env(self, name: str) -> dict[str, str]:
        svc = self.services[name]
        env = {
            "PATH": f"{self.shims}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
            "HOSTNAME": self.hostname,
        }
        if self._is_airflow_image(name):
            env["AIRFLOW_HOME"] = str(self.home)
            # each container has its own network: the ports Airflow binds by default get their own here
            env.update(
                {
                    "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
                    "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
                    "AIRFLOW__API__HOST": "127.0.0.1",
                    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_HOST": "127.0.0.1",
                }
            )
        env.update(
            {k: self.translate(name, str(v).replace("$$", "$")) for k, v in (svc.get("environment") or {}).items()}
        )
        return env

    def healthcheck(self, name: str) -> list[str] | None:
        test = _argv(self.services[name].get("healthcheck", {}).get("test"))
        if not test:
            return None
        if test[0] == "CMD-SHELL":
            return ["/bin/sh", "-c", self.translate(name, test[1])]
        return [self.translate(name, a) for a in test[1:]]

    # -- running ---------------------------------------------------------------------------------
    def prepare(self) -> None:
        _psql(
            "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'airflow') "
            "THEN CREATE ROLE airflow LOGIN; END IF; END $$"
        )
        _psql(f"CREATE DATABASE {self.database} OWNER airflow")
        # what Airflow records as a job's hostname; Docker sets HOSTNAME to the container's
        proc = subprocess.run(
            [sys.executable, "-c", "from airflow.utils.net import get_hostname; print(get_hostname())"],
            env=self.env("airflow-scheduler"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        self.hostname = proc.stdout.strip().splitlines()[-1]
        for name in self.services:
            if name == "postgres":
                continue
            hc = self.services[name].get("healthcheck", {})
            workdir = self.home if self._is_airflow_image(name) else self.volumes["redis-data"]  # redis's is /data
            self.run[name] = Service(
                name,
                self.argv(name),
                self.env(name),
                workdir,
                self.healthcheck(name),
                _seconds(hc.get("timeout", "30s")),
                self.tmp / f"{name}.log",
            )

    def _ready(self, dep: str, cond: str) -> bool:
        if dep == "postgres":  # the machine's server stands in; its compose healthcheck must pass
            test = self.services["postgres"]["healthcheck"]["test"][1:]
            env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": "5432"}
            return subprocess.run(test, env=env, capture_output=True, timeout=30).returncode == 0
        svc = self.run[dep]
        if cond == "service_completed_successfully":
            return svc.done
        return svc.healthy_after is not None

    def start_all(self, deadline: float) -> None:
        t0 = time.monotonic()
        while True:
            for svc in self.run.values():
                if svc.proc is None and all(
                    self._ready(d, c["condition"]) for d, c in self.services[svc.name].get("depends_on", {}).items()
                ):
                    with open(svc.log, "wb") as log:
                        svc.proc = subprocess.Popen(
                            svc.argv,
                            env=svc.env,
                            cwd=svc.cwd,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,
                        )
                    svc.started = time.monotonic()
                    svc.notes.append(f"started at +{svc.started - t0:.1f}s")
            for svc in self.run.values():
                if svc.proc is None or svc.done or svc.healthy_after is not None:
                    continue
                code = svc.proc.poll()
                if svc.health is None:
                    if code is not None:
                        assert code == 0, f"{svc.name} exited {code}:\n{self.tail(svc)}"
                        svc.done, svc.healthy_after = True, time.monotonic() - svc.started
                    continue
                assert code is None, f"{svc.name} exited {code} before it was healthy:\n{self.tail(svc)}"
                self._probe(svc)
            if all(s.done or s.healthy_after is not None for s in self.run.values()):
                return
            waiting = {s.name: s.last_check[-300:] for s in self.run.values() if not (s.done or s.healthy_after)}
            assert time.monotonic() < deadline, f"not healthy in time: {waiting}\n" + "\n".join(
                self.tail(self.run[n]) for n in waiting
            )
            time.sleep(0.2)

    def _probe(self, svc: Service) -> None:
        now = time.monotonic()
        if svc.check_proc is None:
            if now - svc.check_started >= 1.0:
                with open(svc.log.with_suffix(".health"), "wb") as out:
                    svc.check_proc = subprocess.Popen(
                        svc.health,
                        env=svc.env,
                        cwd=svc.cwd,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                svc.check_started = now
            return
        if svc.check_proc.poll() is None:
            if now - svc.check_started > svc.health_timeout:  # Docker counts a slow check as a failure
                os.killpg(svc.check_proc.pid, signal.SIGKILL)
                svc.check_proc.wait()
                svc.last_check, svc.check_proc = f"timed out after {svc.health_timeout:.0f}s", None
                svc.checks += 1
            return
        out = svc.log.with_suffix(".health").read_text(errors="replace")
        svc.checks += 1
        svc.last_check = f"exit {svc.check_proc.returncode}: {out.strip()}"
        if svc.check_proc.returncode == 0:
            svc.healthy_after = now - svc.started
        svc.check_proc = None

    def tail(self, svc: Service) -> str:
        return f"--- {svc.name}: {' '.join(svc.argv)[:300]}\n" + (
            svc.log.read_text(errors="replace")[-3000:] if svc.log.exists() else "(no log)"
        )

    def stop(self) -> dict[str, int | None]:
        """SIGTERM each process group (what `docker compose down` sends), SIGKILL after 60 s."""
        live = [s for s in self.run.values() if s.proc is not None]
        for svc in live:
            if svc.check_proc is not None and svc.check_proc.poll() is None:
                os.killpg(svc.check_proc.pid, signal.SIGKILL)
                svc.check_proc.wait()
            if svc.proc.poll() is None:
                os.killpg(svc.proc.pid, signal.SIGTERM)
        codes: dict[str, int | None] = {}
        t0 = time.monotonic()
        while len(codes) < len(live) and time.monotonic() - t0 < 60:
            for svc in live:
                if svc.name not in codes and svc.proc.poll() is not None:
                    codes[svc.name] = svc.proc.returncode
                    svc.notes.append(f"stopped after {time.monotonic() - t0:.1f}s")
            time.sleep(0.1)
        for svc in live:
            if svc.name not in codes:
                os.killpg(svc.proc.pid, signal.SIGKILL)
                svc.proc.wait(10)
                codes[svc.name] = None
                svc.notes.append("killed after 60s")
        return codes


@pytest.fixture(scope="module")
def stack(config: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    try:  # the image's Postgres drivers (Airflow 3 opens a sync and an async engine)
        import asyncpg  # noqa: F401
        import psycopg2  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"the compose stack needs Postgres drivers (test extra: psycopg2-binary, asyncpg): {exc}")
    local = LocalStack(config, tmp_path_factory.mktemp("compose-stack"))
    local.prepare()
    started = time.monotonic()
    try:
        local.start_all(deadline=started + 300)
        print(f"\ncompose stack: every service healthy {time.monotonic() - started:.1f}s after the first start")
        for svc in local.run.values():
            state = "completed" if svc.done else "healthy"
            command = " ".join(" ".join(_argv(local.services[svc.name].get("command"))).split())
            print(
                f"  {svc.name:22} {svc.notes[0]:18} {state} after {svc.healthy_after:5.1f}s "
                f"({svc.checks} checks): {command[:100]}"
            )
        yield local
    finally:
        stopping = time.monotonic()
        codes = local.stop()
        print(
            f"\ncompose stack: stopped in {time.monotonic() - stopping:.1f}s, exit codes {codes}",
            {s.name: s.notes[-1] for s in local.run.values()},
        )
        _psql(f"DROP DATABASE IF EXISTS {local.database} WITH (FORCE)")


RUN = pytest.mark.timeout(420)


@RUN
def test_every_service_command_line_runs_and_passes_its_healthcheck(stack: LocalStack) -> None:
    assert set(stack.run) == set(stack.services) - {"postgres"}
    assert stack.run["airflow-init"].done
    for name, svc in stack.run.items():
        if name != "airflow-init":
            assert svc.healthy_after is not None and svc.proc.poll() is None, name


@RUN
def test_airflow_init_migrated_created_the_admin_and_chowned_the_volumes(
    stack: LocalStack, secrets: dict[str, str]
) -> None:
    assert "airflow-init: database migrated; user admin" in stack.run["airflow-init"].log.read_text()
    assert _psql("SELECT count(*) FROM alembic_version", stack.database).strip() == "1"
    assert _psql("SELECT count(*) FROM dag", stack.database).strip() != "0"  # the dag-processor wrote there
    for volume in ("chasqui-data", "airflow-logs", "airflow-auth"):
        path = stack.volumes[volume]
        assert (path.stat().st_uid, path.stat().st_gid) == (IMAGE_UID, 0), volume
    auth = stack.volumes["airflow-auth"]
    passwords = Path(stack.run["airflow-apiserver"].env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"])
    assert passwords.parent == auth and stat.S_IMODE(auth.stat().st_mode) == 0o700
    assert stat.S_IMODE(passwords.stat().st_mode) == 0o600 and passwords.stat().st_uid == IMAGE_UID
    assert json.loads(passwords.read_text()) == {"admin": secrets["AIRFLOW_ADMIN_PASSWORD"]}


@RUN
def test_the_admin_logs_in_with_a_token_signed_by_the_shared_jwt_secret(
    stack: LocalStack, secrets: dict[str, str]
) -> None:
    import jwt

    url = f"http://127.0.0.1:{stack.ports[('airflow-apiserver', 8080)]}/auth/token"

    def login(password: str) -> tuple[int, dict]:
        body = json.dumps({"username": "admin", "password": password}).encode()
        req = urllib.request.Request(url, body, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as reply:
                return reply.status, json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            return exc.code, {}

    status, reply = login(secrets["AIRFLOW_ADMIN_PASSWORD"])
    assert status == 201, reply
    claims = jwt.decode(
        reply["access_token"], secrets["AIRFLOW_JWT_SECRET"], algorithms=["HS512"], options={"verify_aud": False}
    )
    assert claims["sub"] == "admin" and claims["role"].upper() == "ADMIN"
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(reply["access_token"], uuid.uuid4().hex * 2, algorithms=["HS512"], options={"verify_aud": False})
    assert login("not-the-password")[0] == 401


@RUN
def test_redis_refuses_clients_without_the_password(stack: LocalStack, secrets: dict[str, str]) -> None:
    port = stack.ports[("redis", 6379)]
    with redis.Redis(host="127.0.0.1", port=port) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    with redis.Redis(host="127.0.0.1", port=port, password=secrets["REDIS_PASSWORD"]) as client:
        assert client.ping() and client.config_get("appendonly") == {"appendonly": "yes"}
        assert Path(client.config_get("dir")["dir"]) == stack.volumes["redis-data"]
        # both workers consume from this Redis (not from a default URL that happens to answer)
        for name in WORKERS:
            command = _argv(stack.services[name]["command"])
            queue = command[command.index("--queue") + 1]
            stream = QueueKeys.for_queue(queue).stream
            assert client.exists(stream), f"{name}: its queue {queue} has no stream on the compose Redis"
            groups = [g["name"] for g in client.xinfo_groups(stream)]
            assert groups == [b"default"], (name, groups)  # the worker made its consumer group here


@RUN
def test_an_airflow_connection_job_reaches_the_compose_worker(stack: LocalStack) -> None:
    """``chasqui_default`` as the triggerer's environment defines it (password included) reaches
    the compose Redis, and the chasqui-worker service runs the example handlers on its queue."""
    code = (
        "from airflow_provider_chasqui.hooks.chasqui import ChasquiHook\n"
        "with ChasquiHook().get_queue('chasqui-examples') as q:\n"
        "    job = q.add('square', {'x': 12})\n"
        "    print('RESULT', q.wait_for_result(job.id, timeout=60))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env=stack.run["airflow-triggerer"].env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT {'x': 12, 'square': 144}" in proc.stdout
    for name in WORKERS:
        command = _argv(stack.services[name]["command"])
        port = stack.ports[(name, int(command[command.index("--metrics-port") + 1]))]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as reply:
            health = json.loads(reply.read())
        assert health["checks"]["redis"] is True and health["status"] == "ok", (name, health)
