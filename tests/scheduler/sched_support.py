"""Helpers of the scheduler suite: a fake clock, reading fires off the stream, scheduler processes."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from airflow_provider_chasqui.core.codec import Envelope, decode_envelope, ulid_ms
from airflow_provider_chasqui.core.keys import QueueKeys

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
    entry_ms: int  # when it reached the stream (Redis clock)
    name: str
    envelope: Envelope

    @property
    def scheduled_ms(self) -> int:
        ms = ulid_ms(self.envelope.id)  # a fire's id is a ULID of its scheduled time
        assert ms is not None, self.envelope.id
        return ms


def fires(r: redis.Redis, queue: str, page: int = 10_000) -> list[Fire]:
    """Every entry of the queue's stream, as fires (oldest first), read ``page`` entries per
    XRANGE so a stream of 100k+ fires never arrives as one reply."""
    out = []
    stream = QueueKeys.for_queue(queue).stream
    start: bytes | str = "-"
    while True:
        batch = r.xrange(stream, min=start, count=page)
        for eid, fields in batch:
            f = {k.decode(): v for k, v in fields.items()}
            out.append(Fire(int(eid.split(b"-")[0]), f.get("n", b"").decode(), decode_envelope(f["d"])))
        if len(batch) < page:
            return out
        start = b"(" + batch[-1][0]


def fire_times(r: redis.Redis, queue: str) -> list[int]:
    return [f.scheduled_ms for f in fires(r, queue)]


def spawn_scheduler(url: str, queue: str, *extra: str, log: Any = None) -> subprocess.Popen[bytes]:
    """A scheduler process (``sched_proc.py``); it prints ``ready <holder>`` once running."""
    return subprocess.Popen(
        [sys.executable, str(SCHEDULER_PROC), "--redis-url", url, "--queue", queue, *extra],
        stdout=subprocess.PIPE,
        stderr=log or subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_ready(proc: subprocess.Popen[bytes], timeout: float = 30.0) -> str:
    """The holder id of a ``spawn_scheduler`` process once it prints ``ready``; a process that
    hangs before that fails the test after ``timeout`` seconds instead of blocking the read."""
    import selectors

    assert proc.stdout is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout):
            raise AssertionError(f"scheduler process {proc.pid} printed nothing in {timeout}s (exit {proc.poll()})")
    line = proc.stdout.readline().decode().strip()  # one short line, written with one flush
    if not line.startswith("ready "):
        raise AssertionError(f"scheduler process did not start: {line!r} (exit {proc.poll()})")
    return line.split(" ", 1)[1]


def stop_proc(
    proc: subprocess.Popen[bytes], sig: int | None = None, timeout: float = 20.0
) -> tuple[int, dict[str, int]]:
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
