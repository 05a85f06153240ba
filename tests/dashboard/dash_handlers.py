"""Handlers the dashboard's browser tests run in a real ``chasqui worker`` (loaded by dotted path).

``gated`` dead-letters its job at once until the file named by ``data["gate"]`` exists, so a test
fills the DLQ, opens the gate, and replays from the browser to see the job complete.
"""

from __future__ import annotations

import asyncio
import os

from airflow_provider_chasqui.errors import UnrecoverableError


def gated(job):
    if not os.path.exists(job.data["gate"]):
        raise UnrecoverableError(f"gate closed: {job.data['gate']}")
    return {"passed": job.data["gate"], "n": job.data.get("n")}


def square(job):
    return {"square": int(job.data["x"]) ** 2}


def tick(job):
    return {"tick": job.data}


async def sleepy(job):
    """Reports half its progress, then runs for ``data["secs"]`` (a job to cancel while it runs)."""
    await job.update_progress(50)
    await asyncio.sleep(job.data["secs"])
    return "woke"


HANDLERS = {"gated": gated, "square": square, "tick": tick, "sleepy": sleepy}
