"""Shared helpers of the benchmark scripts: a private Redis, medians, machine facts.

Standard library only, so ``run_peers.py`` can import it from any interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def _server_args(exe: str, port: int, *extra: str) -> list[str]:
    """A loopback redis-server in the foreground with no persistence, plus ``extra``."""
    return [
        exe,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        *extra,
    ]


@contextlib.contextmanager
def private_redis(url: str | None = None) -> Iterator[str]:
    """Yield a Redis URL: ``url`` as given, else a fresh ``redis-server`` on a free loopback
    port (no persistence), stopped by its pid on exit."""
    if url:
        yield url
        return
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found on PATH; pass --redis-url")
    port = free_port()
    proc = subprocess.Popen(
        _server_args(exe, port, "--maxmemory", "0"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not _ping(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"redis-server on port {port} did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def private_cluster(
    masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = 5000
) -> Iterator[dict[int, subprocess.Popen[bytes]]]:
    """Yield a fresh Redis Cluster of ``masters`` nodes, each with ``replicas`` replicas (no
    persistence, every slot assigned, ``cluster_state:ok``, replicas in sync) on free loopback
    ports, as port -> process (the masters first, so a fault can kill one by pid); every node
    is stopped by its pid on exit."""
    exe = shutil.which("redis-server")
    if exe is None or shutil.which("redis-cli") is None:
        raise SystemExit("redis-server and redis-cli are needed on PATH")
    work = Path(tempfile.mkdtemp(prefix="chasqui-bench-cluster-"))
    nodes: dict[int, subprocess.Popen[bytes]] = {}
    try:
        while len(nodes) < masters * (1 + replicas):
            port = free_port()
            if port > 55000 or port in nodes or not _free(port + 10000):
                continue  # the cluster bus listens on port + 10000
            nodes[port] = subprocess.Popen(
                _server_args(
                    exe,
                    port,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    str(node_timeout_ms),
                    "--cluster-config-file",
                    str(work / f"nodes-{port}.conf"),
                    "--dir",
                    str(work),
                ),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        ports = list(nodes)
        deadline = time.monotonic() + 30
        while not all(_ping(p) for p in ports):
            if time.monotonic() > deadline:
                raise SystemExit(f"cluster nodes {ports} did not start")
            time.sleep(0.05)
        subprocess.run(
            ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports], "--cluster-yes"]
            + (["--cluster-replicas", str(replicas)] if replicas else []),
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 60
        while not all(b"cluster_state:ok" in _cluster_info(p) for p in ports) or not all(
            b"master_link_status:up" in _info_replication(p) for p in ports if b"role:slave" in _info_replication(p)
        ):
            if time.monotonic() > deadline:
                raise SystemExit("the cluster did not reach cluster_state:ok with its replicas in sync")
            time.sleep(0.1)
        yield {p: nodes[p] for p in sorted(ports, key=lambda p: b"role:slave" in _info_replication(p))}
    finally:
        for proc in nodes.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in nodes.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _cluster_info(port: int) -> bytes:
    out = subprocess.run(["redis-cli", "-p", str(port), "cluster", "info"], capture_output=True, timeout=10)
    return out.stdout


def _info_replication(port: int) -> bytes:
    out = subprocess.run(["redis-cli", "-p", str(port), "info", "replication"], capture_output=True, timeout=10)
    return out.stdout


def redis_version(url: str) -> str:
    host, port = url.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2) as s:
        s.sendall(b"INFO server\r\n")
        data = b""
        while b"\r\n" not in data or len(data) < 64:
            data += s.recv(65536)
        header, _, rest = data.partition(b"\r\n")
        size = int(header[1:])
        while len(rest) < size:
            rest += s.recv(65536)
    for line in rest.decode().splitlines():
        if line.startswith("redis_version:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def machine() -> dict[str, Any]:
    cpu = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median of every numeric field across runs (``runs`` keeps the raw values)."""
    out: dict[str, Any] = {}
    keys = {k for r in runs for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    for k in sorted(keys):
        values = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
        if values:
            out[k] = statistics.median(values)
    out["runs"] = runs
    return out


def queue_events(url: str, queue: str) -> Iterator[tuple[int, dict[bytes, bytes]]]:
    """``(ms of Redis' clock, fields)`` of every entry of the queue's events stream, in order."""
    import redis

    from airflow_provider_chasqui.core.keys import QueueKeys

    r = redis.Redis.from_url(url)
    try:
        cursor = "-"
        while True:
            rows = r.xrange(QueueKeys.for_queue(queue).events, cursor, "+", count=10_000)
            for eid, fields in rows:
                yield int(eid.split(b"-")[0]), fields
            if len(rows) < 10_000:
                return
            cursor = "(" + rows[-1][0].decode()
    finally:
        r.close()


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
