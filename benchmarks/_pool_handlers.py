"""Handlers for ``bench_pool.py``: module-level, so a pool process imports them by name."""

from __future__ import annotations

from typing import Any

BURN_ROUNDS = 60_000  # ~5 ms of pure Python on this class of machine


def burn(job: Any) -> int:
    """CPU-bound: a pure-Python loop that holds the GIL throughout."""
    total = 0
    for i in range(BURN_ROUNDS):
        total += i * i % 7
    return total


def noop(job: Any) -> None:
    return None


async def anoop(job: Any) -> None:
    return None
