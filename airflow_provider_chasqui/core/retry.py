"""Pure backoff maths (wire spec section 14.1).  No I/O, no clocks."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .codec import BackoffWire

__all__ = ["RetryPolicy", "backoff_ms"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Queue-wide retry defaults; a per-job BackoffWire overrides field by field."""

    initial_ms: int = 100
    max_ms: int = 30_000
    multiplier: float = 2.0
    jitter_ms: int = 100


def backoff_ms(n: int, spec: BackoffWire | None, policy: RetryPolicy, rng: random.Random | None = None) -> int:
    """Delay before retry number ``n`` (1-indexed = the failed run's attempt + 1)."""
    if spec is None:
        kind, delay, cap, mult, jitter = "exponential", policy.initial_ms, policy.max_ms, policy.multiplier, policy.jitter_ms
    else:
        kind = spec.kind
        delay = spec.delay_ms
        cap = policy.max_ms if spec.max_delay_ms is None else spec.max_delay_ms
        mult = policy.multiplier if spec.multiplier is None else spec.multiplier
        jitter = policy.jitter_ms if spec.jitter_ms is None else spec.jitter_ms
    if kind == "fixed":
        base = float(delay)
    else:  # "exponential" and unknown kinds, as ChasquiMQ's consumer does
        try:
            base = delay * (mult ** max(0, n - 1))
        except OverflowError:  # f64 saturates to infinity in ChasquiMQ; the cap applies
            base = float("inf") if delay > 0 else 0.0
    capped = int(min(max(base, 0.0), float(cap)))
    if jitter > 0:
        capped += (rng or random).randrange(jitter)
    return capped
