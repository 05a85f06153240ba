"""Handlers the worker tests run in real ``chasqui worker`` subprocesses (loaded by dotted path).

``hold`` blocks until the test releases it: it writes ``started-<job id>`` into the job's
``dir`` and returns once ``release`` exists there, so tests control exactly how long a job
runs without sleeping to synchronise.  ``stubborn`` does the same as an ``async def`` that
swallows every cancellation (a bare ``except:`` in a loop).
"""

from __future__ import annotations

import os
import time

from airflow_provider_chasqui.worker import handler


@handler("echo")
def echo(job):
    return {"echo": job.data}


@handler("fail")
def fail(job):
    raise RuntimeError(f"fail handler refuses {job.data!r}")


@handler("hold")
def hold(job):
    folder = job.data["dir"]
    with open(os.path.join(folder, f"started-{job.id}"), "w") as fh:
        fh.write(str(os.getpid()))
    deadline = time.monotonic() + float(job.data.get("max_hold", 60))
    while not os.path.exists(os.path.join(folder, "release")):
        if time.monotonic() > deadline:
            raise TimeoutError("hold was never released")
        time.sleep(0.01)
    return {"held": job.id}


@handler("slow_async")
async def slow_async(job):
    import asyncio

    await asyncio.sleep(float(job.data.get("secs", 0.01)))
    return "ok"


@handler("stubborn")
async def stubborn(job):
    import asyncio

    folder = job.data["dir"]
    with open(os.path.join(folder, f"started-{job.id}"), "w") as fh:
        fh.write(str(os.getpid()))
    deadline = time.monotonic() + float(job.data.get("max_hold", 60))
    while not os.path.exists(os.path.join(folder, "release")) and time.monotonic() < deadline:
        try:
            await asyncio.sleep(0.02)
        except asyncio.CancelledError:  # the hostile part
            pass
    return "released"
