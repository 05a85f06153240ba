"""Helpers of the scheduler suite: a fake clock, reading fires off the stream, a test cluster."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from airflow_provider_chasqui.core.codec import Envelope, decode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.scheduler import fire_time_of
from servers import RunningServer, start_server

HERE = Path(__file__).resolve().parent
SCHEDULER_PROC = HERE / "sched_proc.py"


class FakeClock:
    """A settable epoch-ms clock for ``Scheduler(now_fn=...)``."""

    def __init__(self, start_ms: int) -> None:
        self.ms = start_ms

    def __call__(self) -> int:
        return self.ms

    def advance(self, ms: int) -> int:
        self.ms += ms
        return self.ms

    def set(self, ms: int) -> int:
        self.ms = ms
        return ms


@dataclass(frozen=True)
class Fire:
    entry_ms: int          # when it reached the stream (Redis clock)
    name: str
    envelope: Envelope

    @property
    def scheduled_ms(self) -> int:
        return fire_time_of(self.envelope.id)


def fires(r: redis.Redis, queue: str) -> list[Fire]:
    """Every entry of the queue's stream, as fires (oldest first)."""
    out = []
    for eid, fields in r.xrange(QueueKeys.for_queue(queue).stream):
        f = {k.decode(): v for k, v in fields.items()}
        out.append(Fire(int(eid.split(b"-")[0]), f.get("n", b"").decode(), decode_envelope(f["d"])))
    return out


def fire_times(r: redis.Redis, queue: str) -> list[int]:
    return [f.scheduled_ms for f in fires(r, queue)]


@dataclass
class Cluster:
    nodes: list[RunningServer]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}/0?cluster=true"

    def stop(self) -> None:
        for n in self.nodes:
            if n.running:
                n.stop()


def _cluster_port() -> int:
    """A free port below 55536 whose cluster bus port (+10000) is free too."""
    import random
    import socket

    for _ in range(200):
        port = random.randint(20000, 55000)
        try:
            for p in (port, port + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


@contextlib.contextmanager
def redis_cluster(tmp_path: Path, masters: int = 3) -> Iterator[Cluster]:
    """``masters`` Redis 7 nodes on free loopback ports joined with ``redis-cli --cluster create``."""
    nodes = []
    try:
        for i in range(masters):
            d = tmp_path / f"node{i}"
            d.mkdir()
            nodes.append(start_server("redis7", tmpdir=d, port=_cluster_port(), extra_args=(
                "--cluster-enabled", "yes", "--cluster-config-file", str(d / "nodes.conf"),
                "--cluster-node-timeout", "5000")))
        subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in nodes], "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while True:
            states = []
            for n in nodes:
                with redis.Redis(port=n.port) as r:
                    states.append(r.execute_command("CLUSTER", "INFO").decode())
            if all("cluster_state:ok" in s for s in states):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"cluster did not become ok: {states}")
            time.sleep(0.1)
        yield Cluster(nodes)
    finally:
        for n in nodes:
            if n.running:
                n.stop()


def spawn_scheduler(url: str, queue: str, *extra: str, log: Any = None) -> subprocess.Popen[bytes]:
    """A scheduler process (``sched_proc.py``); it prints ``ready <holder>`` once running."""
    return subprocess.Popen([sys.executable, str(SCHEDULER_PROC), "--redis-url", url, "--queue", queue, *extra],
                            stdout=subprocess.PIPE, stderr=log or subprocess.DEVNULL, start_new_session=True)


def wait_ready(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = proc.stdout.readline().decode().strip()
    if not line.startswith("ready ") or time.monotonic() > deadline:
        raise AssertionError(f"scheduler process did not start: {line!r} (exit {proc.poll()})")
    return line.split(" ", 1)[1]


def stop_proc(proc: subprocess.Popen[bytes], sig: int | None = None, timeout: float = 20.0) -> tuple[int, dict[str, int]]:
    """SIGTERM (by pid) and wait; returns the exit code and the ``stats`` line's counters."""
    import signal as _signal

    if proc.poll() is None:
        proc.send_signal(sig if sig is not None else _signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
    stats: dict[str, int] = {}
    if proc.stdout is not None:
        for line in proc.stdout.read().decode().splitlines():
            if line.startswith("stats "):
                stats = {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}
        proc.stdout.close()
    return proc.returncode, stats
