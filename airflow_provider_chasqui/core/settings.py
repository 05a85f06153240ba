"""Frozen settings shared by producers and workers (defaults are ChasquiMQ's)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from ..errors import ConfigError, ConfigTypeError

__all__ = ["QueueSettings", "check_flags", "check_int", "window_to_ms", "MAX_MS", "MAX_COUNT"]

I64_MAX = 2**63 - 1
MAX_MS = 3650 * 86_400_000  # ten years: the longest wait, lease, interval or TTL taken; far inside SET PX
MAX_COUNT = 1_000_000  # the largest count (jobs at once, entries per read, rows per batch)


def check_int(name: str, value: object, least: int, most: int) -> int:
    """``value`` if an int (a bool is not) from ``least`` to ``most``, else a ``ConfigError``
    naming ``name``: a NaN, None or str interval, count or TTL failed later, in a loop."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        if least == 1:
            raise ConfigError(f"{name} must be a positive int, got {value!r}")
        raise ConfigError(f"{name} must be an int from {least:,} to {most:,}, got {value!r}")
    if value > most:
        raise ConfigError(f"{name} must be at most {most:,}, got {value!r}")
    return value


def check_index(name: str, value: object, least: int, most: int) -> int:
    """``value`` if an int (a bool is not) from ``least`` to ``most``: a ``ConfigTypeError``
    (a ``TypeError``, as chasquimq raises) for another type, a ``ConfigError`` out of range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigTypeError(f"{name} must be an int, got {type(value).__name__}")
    if not least <= value <= most:
        raise ConfigError(f"{name} must be from {least:,} to {most:,}, got {value}")
    return value


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
            if value > I64_MAX:  # a MAXLEN or a PX Redis parses as a long long
                raise ConfigError(f"{name} must be at most {I64_MAX}, got {value!r}")
        if isinstance(self.max_delay_secs, bool) or not isinstance(self.max_delay_secs, int) or self.max_delay_secs < 0:
            raise ConfigError(f"max_delay_secs must be a non-negative int, got {self.max_delay_secs!r}")

    @classmethod
    def given(cls, settings: object, **limits: object) -> QueueSettings:
        """A queue's settings as its constructor got them: ``settings=`` or the individual
        limits (None: the default), not both."""
        chosen = {k: v for k, v in limits.items() if v is not None}
        if settings is None:
            return cls(**chosen)  # type: ignore[arg-type]  # each field checks its own type
        if not isinstance(settings, cls):
            raise ConfigTypeError(f"settings must be a QueueSettings, got {type(settings).__name__}")
        if chosen:
            raise ConfigError("pass settings= or the individual limits, not both")
        return settings


def check_flags(**flags: object) -> None:
    """On/off arguments whose None means "decide for me" (``fast_paths``, ``tracing``): each
    True, False or None."""
    for name, value in flags.items():
        if value is not None and not isinstance(value, bool):
            raise ConfigError(f"{name} must be True, False or None, got {value!r}")


def window_to_ms(window: timedelta | float) -> int:
    """A deduplication window (seconds or a timedelta) in ms, from 1 ms to ``MAX_MS``;
    both queue twins use it."""
    secs = window.total_seconds() if isinstance(window, timedelta) else window
    if isinstance(secs, bool) or not isinstance(secs, (int, float)) or not 0.001 <= secs <= MAX_MS / 1000:
        raise ConfigError(
            f"window must be a number of seconds or a timedelta from 1 ms to {MAX_MS // 86_400_000} days,"
            f" got {window!r}"
        )
    return int(secs * 1000)
