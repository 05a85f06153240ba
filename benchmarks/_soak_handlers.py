"""The soak benchmark's handler (``bench_soak.py`` runs ``chasqui worker --handlers _soak_handlers``).

Every job returns a small result (stored: ``chasqui worker`` stores results by default); jobs
with ``{"f": 1}`` fail their first attempt, so the retry path runs too.
"""

from __future__ import annotations

from typing import Any


def work(job: Any) -> dict[str, int]:
    if job.data.get("f") and job.attempt == 0:
        raise ValueError("first attempt fails")
    return {"i": job.data["i"], "ok": 1}


HANDLERS = {"work": work}
