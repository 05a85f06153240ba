"""Handlers for the process-pool tests (``tests/engine/test_process_pool.py``): module-level, so
they pickle by name and a pool process imports them (``tests/`` is on the path it inherits)."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from typing import Any

from airflow_provider_chasqui import RateLimited, UnrecoverableError


def pid(job: Any) -> int:
    return os.getpid()


async def apid(job: Any) -> int:
    await asyncio.sleep(0.01)
    return os.getpid()


def spin(job: Any) -> None:
    """A plain handler that never returns (and never releases the GIL for long)."""
    n = 0
    while True:
        n += 1


async def block(job: Any) -> None:
    """An async handler that blocks its loop: only killing its process stops it.  Reports
    progress 1 first, so a test knows it runs."""
    await job.update_progress(1)
    time.sleep(3600)


def burn(job: Any) -> int:
    """CPU-bound work: ``job.data`` rounds of a pure-Python loop."""
    total = 0
    for i in range(int(job.data)):
        total += i * i % 7
    return total


def die(job: Any) -> None:
    os._exit(int(job.data or 3))


def hog(job: Any) -> None:
    """Touch ``job.data`` MB, then wait for the pool to notice."""
    held = b"x" * (int(job.data) << 20)
    time.sleep(60)
    del held


def report(job: Any) -> str:
    job.update_progress_sync(40)
    time.sleep(0.4)
    job.update_progress_sync({"stage": "last", "pct": 90})
    time.sleep(0.4)
    return "reported"


def leave_reporting(job: Any) -> str:
    """Starts a thread that reports every 10 ms and returns, leaving it running; the thread
    writes what its first refused report raised to ``<job.data>/refused`` and ends."""
    folder = str(job.data)

    def loop() -> None:
        give_up = time.monotonic() + 60
        try:
            while time.monotonic() < give_up:
                job.update_progress_sync(round(time.monotonic(), 3))
                time.sleep(0.01)
        except RuntimeError as exc:
            with open(os.path.join(folder, "refused"), "w") as fh:
                fh.write(str(exc))

    threading.Thread(target=loop, daemon=True).start()
    time.sleep(0.1)
    return "left"


def fail(job: Any) -> None:
    if job.data == "unrecoverable":
        raise UnrecoverableError("no use retrying")
    raise ValueError(f"bad input {job.data!r}")


def nap(job: Any) -> int:
    time.sleep(float(job.data))
    return os.getpid()


def noop(job: Any) -> None:
    return None


def sums(jobs: list[Any]) -> list[Any]:
    """A batch handler: one result per job, an exception instance for a job whose data is -1."""
    return [ValueError(f"job {j.id} refused") if j.data == -1 else j.data * 2 for j in jobs]


def limited(job: Any) -> str:
    """Refused once with ``RateLimited`` (its first call creates the file ``job.data`` names), then runs."""
    try:
        with open(job.data, "x"):
            pass
    except FileExistsError:
        return f"ran at attempt {job.attempt}"
    raise RateLimited(300, "the partner said 429")


sums.chasqui_batch_size = 100  # type: ignore[attr-defined]

HANDLERS = {
    "pid": pid,
    "apid": apid,
    "spin": spin,
    "block": block,
    "burn": burn,
    "die": die,
    "hog": hog,
    "report": report,
    "fail": fail,
    "noop": noop,
    "nap": nap,
    "sums": sums,
    "limited": limited,
    "leave_reporting": leave_reporting,
}


async def anoop(job: Any) -> None:
    return None


HANDLERS["anoop"] = anoop


class Unrebuildable:
    """Pickles in the child; its rebuilding fails in the parent."""

    def __setstate__(self, state: Any) -> None:
        raise ValueError("cannot be rebuilt here")


def unsendable(job: Any) -> Any:
    """A result the child cannot pickle: a dict (its pickling failure once ended the child)."""
    return {"lock": threading.Lock()} if job.data == "dict" else (i for i in range(3))


def unreadable(job: Any) -> Any:
    made = Unrebuildable()
    made.__dict__["x"] = 1  # a state, so unpickling calls __setstate__
    return made


def leave(job: Any) -> None:
    """A handler ending its process's way: ``sys.exit`` or a ``KeyboardInterrupt``."""
    if job.data == "interrupt":
        raise KeyboardInterrupt
    sys.exit(int(job.data))


async def acancelled(job: Any) -> None:
    raise asyncio.CancelledError


class TwoArgs(Exception):
    """Pickles, but its rebuilding calls ``__init__`` with one argument: it cannot cross as itself."""

    def __init__(self, a: Any, b: Any) -> None:
        super().__init__(f"{a}/{b}")


def picky_sums(jobs: list[Any]) -> list[Any]:
    """A batch handler failing the job whose data is -1 with an exception that cannot cross the pipe."""
    return [TwoArgs("refused", j.id) if j.data == -1 else j.data * 2 for j in jobs]


picky_sums.chasqui_batch_size = 20  # type: ignore[attr-defined]
HANDLERS.update(unsendable=unsendable, unreadable=unreadable, leave=leave, acancelled=acancelled, picky_sums=picky_sums)


def write_log(job: Any) -> int:
    """Logs ``job.data`` lines (from a child process), one bad line refused on the way."""
    for i in range(int(job.data)):
        job.log_sync(f"pooled {i}")
    try:
        job.log_sync(b"bytes")  # type: ignore[arg-type]
    except TypeError:
        job.log_sync("refused: bytes")
    return int(job.data)


HANDLERS["write_log"] = write_log


def view(job: Any) -> Any:
    """A result msgpack packs (``job.data`` bytes) but pickle cannot (a memoryview): past
    ``max_result_bytes`` it fails in the child, before pickling; under it, it cannot cross."""
    return memoryview(b"v" * int(job.data))


def views(jobs: list[Any]) -> list[Any]:
    """``view`` for each job of a batch."""
    return [view(j) if j.data else j.id for j in jobs]


views.chasqui_batch_size = 10  # type: ignore[attr-defined]
HANDLERS.update(view=view, views=views)
