"""Handlers for the example DAGs: a worker runs them, Airflow only sees their results.

Start a worker for the examples (results stored, so sensors can return them)::

    python -c "import asyncio; from airflow_provider_chasqui import Worker; \\
    from airflow_provider_chasqui.examples.handlers import HANDLERS; \\
    asyncio.run(Worker('chasqui-examples', HANDLERS, store_results=True).run())"

Results are JSON-compatible (str, numbers, lists, dicts with str keys) because Airflow
carries them through XCom.  Must never import airflow.
"""

from __future__ import annotations

from typing import Any

from ..errors import UnrecoverableError
from ..types import Job

__all__ = ["HANDLERS", "square", "greet", "explode", "daily_report"]


def square(job: Job) -> dict[str, int]:
    """``{"x": n}`` -> ``{"x": n, "square": n * n}``."""
    x = int(job.data["x"])
    return {"x": x, "square": x * x}


def greet(job: Job) -> str:
    return f"hello, {job.data.get('who', 'world')}"


def explode(job: Job) -> Any:
    """Always dead-letters the job at once (an ``UnrecoverableError`` skips the retries)."""
    raise UnrecoverableError(f"explode refuses {job.data!r}")


def daily_report(job: Job) -> dict[str, Any]:
    """What the daily cron spec of ``example_dags/daily_cron_upsert.py`` runs."""
    return {"report": job.data.get("report", "daily"), "job_id": job.id}


HANDLERS = {"square": square, "greet": greet, "explode": explode, "daily_report": daily_report}
