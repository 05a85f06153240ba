"""The web dashboard: queues, jobs, DLQ, schedules and workers, standalone
(``chasqui dashboard``) or inside Airflow's API server (``plugin.py``).

``create_app`` needs FastAPI (Airflow ships it; the ``dashboard`` extra brings it otherwise):
it is imported on first use, so importing this package costs nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
