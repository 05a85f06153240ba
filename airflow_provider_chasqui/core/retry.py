"""Pure backoff maths (wire spec section 14.1).  No I/O, no clocks.

:func:`backoff_ms` is total: whatever the override holds (a NaN or infinite multiplier, huge
exponents, a zero or negative cap, negative jitter), it returns an int in
``0..MAX_BACKOFF_MS`` and never raises.  The decoder already refuses such overrides
(``decode_failed``); this is the second line, for values built in-process.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..errors import ConfigError
from .codec import BackoffWire

__all__ = ["RetryPolicy", "backoff_ms", "MAX_BACKOFF_MS"]

MAX_BACKOFF_MS = 2**52
"""Longest delay :func:`backoff_ms` returns (~142,000 years): ``now + delay`` stays an exact
double (a ZSET score) and fits the spec's i64 ``run_at_ms``."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Queue-wide retry defaults; a per-job BackoffWire overrides field by field."""

    initial_ms: int = 100
    max_ms: int = 30_000
    multiplier: float = 2.0
    jitter_ms: int = 100

    def __post_init__(self) -> None:
        for name in ("initial_ms", "max_ms", "jitter_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_BACKOFF_MS:
                raise ConfigError(f"retry {name} must be an int in 0..{MAX_BACKOFF_MS}, got {value!r}")
        m = self.multiplier
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < math.inf:
            raise ConfigError(f"retry multiplier must be a finite non-negative number, got {m!r}")


def _ms(value: int) -> int:
    """An int clamped into ``0..MAX_BACKOFF_MS``."""
    return 0 if value <= 0 else min(value, MAX_BACKOFF_MS)


def backoff_ms(n: int, spec: BackoffWire | None, policy: RetryPolicy, rng: random.Random | None = None) -> int:
    """Delay before retry number ``n`` (1-indexed = the failed run's attempt + 1)."""
    if spec is None:
        kind, delay, cap, mult, jitter = (
            "exponential",
            policy.initial_ms,
            policy.max_ms,
            policy.multiplier,
            policy.jitter_ms,
        )
    else:
        kind = spec.kind
        delay = spec.delay_ms
        cap = policy.max_ms if spec.max_delay_ms is None else spec.max_delay_ms
        mult = policy.multiplier if spec.multiplier is None else spec.multiplier
        jitter = policy.jitter_ms if spec.jitter_ms is None else spec.jitter_ms
    cap, delay = _ms(cap), _ms(delay)
    if kind == "fixed":
        capped = min(delay, cap)
    else:  # "exponential" and unknown kinds, as ChasquiMQ's consumer does
        try:
            base = delay * (float(mult) ** max(0, n - 1))
        except (OverflowError, ZeroDivisionError):  # f64 saturates to infinity in ChasquiMQ; the cap applies
            base = math.inf
        if base != base or base >= cap:  # NaN: Rust's f64::min(NaN, cap) is the cap
            capped = cap
        else:
            capped = int(base) if base > 0 else 0  # a negative base (negative multiplier) is 0
    jitter = _ms(jitter)
    if jitter > 0:
        capped += (rng or random).randrange(jitter)
    return min(capped, MAX_BACKOFF_MS)
