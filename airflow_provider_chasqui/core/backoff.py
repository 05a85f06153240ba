"""Per-job retry options: ``BackoffSpec`` (chasquimq's shape) and the envelope override built
from ``attempts``/``backoff``.  In the core because producers and schedules build overrides
here; ``airflow_provider_chasqui.types`` (the public home) re-exports them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, ConfigTypeError
from .codec import U32_MAX, U64_MAX, BackoffWire, RetryOverride

__all__ = ["BACKOFF_KINDS", "BackoffSpec", "build_retry_override", "coerce_backoff"]

BACKOFF_KINDS = ("fixed", "exponential")


@dataclass(frozen=True)
class BackoffSpec:
    """Per-job retry backoff (``fixed`` or ``exponential``), chasquimq-compatible."""

    kind: str
    delay_ms: int
    max_delay_ms: int | None = None
    multiplier: float | None = None
    jitter_ms: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in BACKOFF_KINDS:
            raise ConfigError(f"unknown backoff kind {self.kind!r}; expected one of {BACKOFF_KINDS}")
        for name in ("delay_ms", "max_delay_ms", "jitter_ms"):
            value = getattr(self, name)
            if value is None and name != "delay_ms":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= U64_MAX:
                raise ConfigError(f"backoff {name} must be an int from 0 to {U64_MAX} (ms), got {value!r}")
        m = self.multiplier
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0):
            raise ConfigError(f"backoff multiplier must be a finite positive number, got {m!r}")

    @staticmethod
    def fixed(delay_ms: int, jitter_ms: int | None = None) -> BackoffSpec:
        return BackoffSpec("fixed", delay_ms, jitter_ms=jitter_ms)

    @staticmethod
    def exponential(
        initial_ms: int, *, multiplier: float = 2.0, max_ms: int | None = None, jitter_ms: int | None = None
    ) -> BackoffSpec:
        return BackoffSpec("exponential", initial_ms, max_ms, multiplier, jitter_ms)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "delay_ms": self.delay_ms}
        for name in ("max_delay_ms", "multiplier", "jitter_ms"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def to_wire(self) -> BackoffWire:
        mult = None if self.multiplier is None else float(self.multiplier)
        return BackoffWire(self.kind, self.delay_ms, self.max_delay_ms, mult, self.jitter_ms)


def coerce_backoff(value: int | BackoffSpec | Mapping[str, Any] | None) -> BackoffSpec | None:
    """``int`` ms -> fixed (as chasquimq does), a ``BackoffSpec``, or its dict form."""
    if value is None or isinstance(value, BackoffSpec):
        return value
    if isinstance(value, bool):
        raise ConfigTypeError("backoff must be an int (ms), a BackoffSpec or a dict, got bool")
    if isinstance(value, int):
        return BackoffSpec.fixed(value)
    if isinstance(value, Mapping):
        allowed = {"kind", "delay_ms", "max_delay_ms", "multiplier", "jitter_ms"}
        unknown = set(value) - allowed
        if unknown:
            raise ConfigError(f"unknown backoff keys {sorted(unknown)}")
        if "kind" not in value or "delay_ms" not in value:
            raise ConfigError("a backoff dict needs 'kind' and 'delay_ms'")
        return BackoffSpec(**value)
    raise ConfigTypeError(f"backoff must be an int (ms), a BackoffSpec or a dict, got {type(value).__name__}")


def build_retry_override(attempts: int | None, backoff: Any) -> RetryOverride | None:
    """The envelope's 5th element, or None when neither option is set."""
    spec = coerce_backoff(backoff)
    if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0):
        raise ConfigError(f"attempts must be a non-negative int, got {attempts!r}")
    if attempts is not None and attempts > U32_MAX:  # msgpack raised OverflowError
        raise ConfigError(f"attempts must be at most {U32_MAX} (a u32 on the wire), got {attempts!r}")
    if attempts is None and spec is None:
        return None
    return RetryOverride(attempts, None if spec is None else spec.to_wire())
