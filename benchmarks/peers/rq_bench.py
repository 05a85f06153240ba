"""RQ: ``Queue.enqueue`` / ``Queue.enqueue_many`` / ``SimpleWorker`` (burst, no fork per job).

RQ runs one job at a time per worker process (no in-process concurrency), so "concurrency 50"
cannot apply; ``SimpleWorker`` is its fastest single-process configuration (the default
``Worker`` forks a child per job).  Delayed jobs use ``enqueue_in`` and the worker's scheduler.
"""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _peer_common as common
from _rq_jobs import noop
from redis import Redis
from rq import Queue, SimpleWorker

try:
    from importlib.metadata import version as _version

    VERSION = _version("rq")
except Exception:  # noqa: BLE001
    VERSION = "?"


class Adapter:
    version = VERSION
    supports_delayed = True

    def enqueue_single(self, url: str, queue: str, n: int) -> None:
        q = Queue(queue, connection=Redis.from_url(url))
        for i in range(n):
            q.enqueue(noop, i)

    def enqueue_bulk(self, url: str, queue: str, n: int, delay_s: float | None = None) -> None:
        q = Queue(queue, connection=Redis.from_url(url))
        if delay_s:
            for i in range(n):
                q.enqueue_in(timedelta(seconds=delay_s), noop, i)
            return
        for start in range(0, n, 1000):
            q.enqueue_many([Queue.prepare_data(noop, (i,)) for i in range(start, min(n, start + 1000))])

    delayed = "delayed" in sys.argv

    def work(self, url: str, queue: str, n: int, counter: common.Counter, concurrency: int) -> None:
        conn = Redis.from_url(url)
        worker = SimpleWorker([Queue(queue, connection=conn)], connection=conn)
        counter.start_clock()
        # Burst mode enqueues one batch (1,000) of due scheduled jobs and quits once the queue is
        # empty; delayed jobs need RQ's normal mode, whose scheduler runs in a child process.
        worker.work(
            burst=counter.n <= 1000 or not self.delayed, max_jobs=n, with_scheduler=True, logging_level="WARNING"
        )


if __name__ == "__main__":
    common.main(Adapter(), "rq")
