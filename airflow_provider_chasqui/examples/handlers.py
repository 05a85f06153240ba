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

__all__ = ["HANDLERS", "daily_report", "explode", "greet", "score_order", "square"]


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


def score_order(job: Job) -> dict[str, Any]:
    """One order row that Spark wrote as a job (``example_dags/spark_events_rollup.py``):
    ``{"order_id", "region", "amount"}`` -> ``{"order_id", "score"}``.  An order with a negative
    amount is refused for good (``UnrecoverableError``: dead-lettered at once, no retries)."""
    data = job.data
    try:
        order_id, amount = int(data["order_id"]), float(data["amount"])
    except (KeyError, TypeError, ValueError):
        raise UnrecoverableError(f"score_order needs {{'order_id', 'amount'}}, got {data!r}") from None
    if amount < 0:
        raise UnrecoverableError(f"score_order refuses order {order_id}: negative amount {amount}")
    return {"order_id": order_id, "score": round(amount / 10, 2)}


HANDLERS = {
    "square": square,
    "greet": greet,
    "explode": explode,
    "daily_report": daily_report,
    "score_order": score_order,
}
