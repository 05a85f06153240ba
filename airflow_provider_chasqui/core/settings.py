"""Frozen settings shared by producers and workers (defaults are ChasquiMQ's)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ..errors import ConfigError

__all__ = ["QueueSettings", "window_to_ms"]


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueSettings:
    """Bounds every writer applies.  All streams are trimmed (MAXLEN ~), and stored results and
    failure records are capped by count as well as by TTL, so memory stays bounded."""

    max_stream_len: int = 1_000_000
    max_delay_secs: int = 30 * 24 * 3600  # 0 disables the check
    max_payload_bytes: int = 1_048_576
    events_max_len: int = 100_000
    dlq_max_len: int = 100_000
    unique_window_ms: int = 100_000  # immediate add with job_id: like XADD IDMP's 100 s window
    # Stored results / failure records kept per queue (newest first), besides their TTL: the
    # oldest beyond this count are deleted by the script that writes new ones.
    results_max_len: int = 10_000
    failures_max_len: int = 10_000

    def __post_init__(self) -> None:
        for name in (
            "max_stream_len",
            "max_payload_bytes",
            "events_max_len",
            "dlq_max_len",
            "unique_window_ms",
            "results_max_len",
            "failures_max_len",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive int, got {value!r}")
        if isinstance(self.max_delay_secs, bool) or not isinstance(self.max_delay_secs, int) or self.max_delay_secs < 0:
            raise ConfigError(f"max_delay_secs must be a non-negative int, got {self.max_delay_secs!r}")


def window_to_ms(window: timedelta | float) -> int:
    """A deduplication window (seconds or a timedelta) in ms; both queue twins use it."""
    if isinstance(window, timedelta):
        return int(window.total_seconds() * 1000)
    if isinstance(window, bool) or not isinstance(window, (int, float)) or window <= 0:
        raise ConfigError(f"window must be a positive number of seconds or a timedelta, got {window!r}")
    return int(window * 1000)
