"""The shared skeleton of every peer benchmark script (standard library only).

Each ``<peer>_bench.py`` defines an adapter and calls :func:`main`; ``run_peers.py`` runs it
in that peer's own virtual environment, once per workload and repeat:

    <venv>/bin/python peers/<peer>_bench.py --redis-url URL --n N --workload W

and reads the one JSON object it prints.  Workloads, the same for every peer:

* ``enqueue_single``: N jobs, one awaited call each;
* ``enqueue_bulk``:   N jobs through the peer's bulk API (or concurrent singles, 1,000 at a time);
* ``process``:        N no-op jobs already queued; one worker *process* (this script again,
  ``--role worker``) with concurrency 50 runs them.  Throughput is N over the span from the
  first handler start to the N-th handler end (measured inside the worker process, so the
  last acknowledgements are not included); CPU is the worker process's getrusage over the
  same span divided by N;
* ``delayed``:        the same after adding the jobs with a 1 s delay and waiting until all are
  due before the worker starts: promotion plus processing.

An adapter is an object with ``enqueue_single(url, queue, n)``, ``enqueue_bulk(url, queue, n,
delay_s=None)`` and ``work(url, queue, n, counter, concurrency)`` (sync or async), plus
``supports_delayed``; its handler calls ``COUNTER.hit()`` once per job.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import resource
import subprocess
import sys
import threading
import time
from typing import Any

CONCURRENCY = 50
DELAY_S = 1.0


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


class Counter:
    """Counts handler calls; thread-safe (some peers run handlers in threads)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.count = 0
        self.first: float | None = None
        self.last: float | None = None
        self.cpu_start = _cpu()
        self.cpu_end: float | None = None
        self.done = threading.Event()
        self._lock = threading.Lock()

    def start_clock(self) -> None:
        self.cpu_start = _cpu()

    def hit(self) -> None:
        with self._lock:
            now = time.time()
            if self.first is None:
                self.first = now
            self.count += 1
            if self.count == self.n:
                self.last = now
                self.cpu_end = _cpu()
                self.done.set()

    async def wait(self, timeout: float | None = None) -> None:
        """Until the N-th job ran (adapters call this, then stop their worker)."""
        timeout = timeout if timeout is not None else 60 + self.n / 100
        deadline = time.monotonic() + timeout
        while not self.done.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {self.count} of {self.n} jobs ran within {timeout:.0f} s")
            await asyncio.sleep(0.005)


COUNTER: Counter | None = None


def hit() -> None:
    assert COUNTER is not None
    COUNTER.hit()


async def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


def _timed(adapter: Any, method: str, url: str, queue: str, n: int) -> dict[str, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(_call(getattr(adapter, method), url, queue, n))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"jobs_per_s": n / wall, "seconds": wall, "client_cpu_us_per_job": cpu / n * 1e6}


def _report(counter: Counter) -> str:
    assert counter.first is not None and counter.last is not None and counter.cpu_end is not None
    return json.dumps(
        {
            "first": counter.first,
            "last": counter.last,
            "cpu_s": counter.cpu_end - counter.cpu_start,
            "count": counter.count,
        }
    )


def _worker_role(adapter: Any, args: argparse.Namespace) -> None:
    """Prints the figures as soon as the N-th job ran; a peer whose shutdown then hangs is cut
    short after a grace period (its shutdown is not what is measured)."""
    global COUNTER
    COUNTER = counter = Counter(args.n)

    def watchdog() -> None:
        counter.done.wait()
        print(_report(counter), flush=True)
        time.sleep(15)
        os._exit(0)

    threading.Thread(target=watchdog, daemon=True).start()
    asyncio.run(_call(adapter.work, args.redis_url, args.queue, args.n, counter, CONCURRENCY))
    if not counter.done.is_set():
        raise SystemExit(f"worker stopped after {counter.count} of {args.n} jobs")
    time.sleep(0.2)  # let the watchdog print
    sys.stdout.flush()
    os._exit(0)


def _process(adapter: Any, args: argparse.Namespace, delayed: bool) -> dict[str, Any]:
    if delayed:
        asyncio.run(_call(adapter.enqueue_bulk, args.redis_url, args.queue, args.n, delay_s=DELAY_S))
        time.sleep(DELAY_S + 0.1)
    else:
        asyncio.run(_call(adapter.enqueue_bulk, args.redis_url, args.queue, args.n))
    cmd = [
        sys.executable,
        os.path.abspath(sys.argv[0]),
        "--role",
        "worker",
        "--redis-url",
        args.redis_url,
        "--n",
        str(args.n),
        "--queue",
        args.queue,
        "--workload",
        args.workload,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120 + args.n / 50)
    if proc.returncode != 0:
        raise SystemExit(f"worker process failed ({proc.returncode}): {proc.stderr[-3000:]}")
    w = json.loads(proc.stdout.strip().splitlines()[-1])
    seconds = max(w["last"] - w["first"], 1e-6)
    return {"jobs_per_s": args.n / seconds, "seconds": seconds, "client_cpu_us_per_job": w["cpu_s"] / args.n * 1e6}


def main(adapter: Any, name: str) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--workload", required=True, choices=("enqueue_single", "enqueue_bulk", "process", "delayed"))
    ap.add_argument("--queue", default=None)
    ap.add_argument("--role", default="main", choices=("main", "worker"))
    args = ap.parse_args()
    args.queue = args.queue or f"bench-{name}-{args.workload}-{os.getpid()}"
    if args.role == "worker":
        _worker_role(adapter, args)
        return
    if args.workload == "delayed" and not getattr(adapter, "supports_delayed", True):
        result: dict[str, Any] = {"unsupported": getattr(adapter, "delayed_note", "not supported")}
    elif args.workload in ("enqueue_single", "enqueue_bulk"):
        result = _timed(adapter, args.workload, args.redis_url, args.queue, args.n)
    else:
        result = _process(adapter, args, delayed=args.workload == "delayed")
    result.update(peer=name, workload=args.workload, n=args.n, version=getattr(adapter, "version", "?"))
    print(json.dumps(result), flush=True)
