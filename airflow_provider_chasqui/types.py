"""Public value types shared by the asyncio and blocking APIs.

``Job`` and ``BackoffSpec`` keep the chasquimq package's shapes so code written for it
runs unchanged; they are frozen and safe to share between tasks and threads.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .core.codec import BackoffWire, RetryOverride
from .errors import ConfigError

if TYPE_CHECKING:
    from .engine.queue import Queue

__all__ = ["Job", "BackoffSpec", "QueueEvent", "coerce_backoff", "build_retry_override", "new_job"]

BACKOFF_KINDS = ("fixed", "exponential")


@dataclass(frozen=True)
class Job:
    """One job as a handler sees it (and as ``Queue.add`` returns it)."""

    id: str
    name: str
    data: Any
    attempt: int
    created_at_ms: int
    _queue: "Queue | None" = field(default=None, repr=False, compare=False, hash=False)

    @property
    def attempts_made(self) -> int:
        return self.attempt

    async def wait_for_result(self, timeout: float = 30.0, **_compat: Any) -> Any:
        """Block on Redis until the job completes; return the handler's result.

        Raises ``JobFailed`` if it went to the DLQ and ``TimeoutError`` on the deadline.
        ``poll_interval`` (chasquimq 1.3) is accepted and unused: we never poll.
        """
        unknown = set(_compat) - {"poll_interval"}
        if unknown:
            raise TypeError(f"unexpected keyword arguments: {sorted(unknown)}")
        if self._queue is None:
            raise RuntimeError("wait_for_result needs a Job returned by Queue.add/add_bulk")
        return await self._queue.wait_for_result(self.id, timeout=timeout)


def _job_builder() -> Callable[..., Job]:
    """``Job(id, name, data, attempt, created_at_ms, _queue)`` for the per-job hot paths
    (producers' returns, the worker's deliveries).

    ``Job`` is a frozen dataclass, whose ``__init__`` sets each field through
    ``object.__setattr__``; filling ``__dict__`` in one go is equal and about 3x cheaper.  Checked
    once against the real constructor; any change to ``Job`` falls back to calling it.
    """
    def plain(job_id: str, name: str, data: Any, attempt: int, created_at_ms: int, _queue: Any = None) -> Job:
        return Job(id=job_id, name=name, data=data, attempt=attempt, created_at_ms=created_at_ms, _queue=_queue)

    try:
        names = tuple(f.name for f in dataclass_fields(Job))
        if names != ("id", "name", "data", "attempt", "created_at_ms", "_queue") or "__slots__" in Job.__dict__ \
                or hasattr(Job, "__post_init__"):
            return plain
        new, set_attr = object.__new__, object.__setattr__

        def fast(job_id: str, name: str, data: Any, attempt: int, created_at_ms: int, _queue: Any = None) -> Job:
            job = new(Job)
            set_attr(job, "__dict__", {"id": job_id, "name": name, "data": data, "attempt": attempt,
                                       "created_at_ms": created_at_ms, "_queue": _queue})
            return job

        probe = ("id", "name", {"k": [1]}, 2, 3)
        a, b = fast(*probe), plain(*probe)
        if a != b or repr(a) != repr(b) or vars(a) != vars(b):
            return plain
        return fast
    except Exception:  # noqa: BLE001 - any surprise: the ordinary constructor
        return plain


new_job = _job_builder()


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
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"backoff {name} must be a non-negative int, got {value!r}")
        m = self.multiplier
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0):
            raise ConfigError(f"backoff multiplier must be a finite positive number, got {m!r}")

    @staticmethod
    def fixed(delay_ms: int, jitter_ms: int | None = None) -> "BackoffSpec":
        return BackoffSpec("fixed", delay_ms, jitter_ms=jitter_ms)

    @staticmethod
    def exponential(
        initial_ms: int, *, multiplier: float = 2.0, max_ms: int | None = None, jitter_ms: int | None = None
    ) -> "BackoffSpec":
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


def coerce_backoff(value: "int | BackoffSpec | Mapping[str, Any] | None") -> BackoffSpec | None:
    """``int`` ms -> fixed (as chasquimq does), a ``BackoffSpec``, or its dict form."""
    if value is None or isinstance(value, BackoffSpec):
        return value
    if isinstance(value, bool):
        raise ConfigError("backoff must be an int (ms), a BackoffSpec or a dict, got bool")
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
    raise ConfigError(f"backoff must be an int (ms), a BackoffSpec or a dict, got {type(value).__name__}")


def build_retry_override(attempts: int | None, backoff: Any) -> RetryOverride | None:
    """The envelope's 5th element, or None when neither option is set."""
    spec = coerce_backoff(backoff)
    if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0):
        raise ConfigError(f"attempts must be a non-negative int, got {attempts!r}")
    if attempts is None and spec is None:
        return None
    return RetryOverride(attempts, None if spec is None else spec.to_wire())


@dataclass(frozen=True)
class QueueEvent:
    """One entry of ``{chasqui:<q>}:events`` (numeric values stay strings, as in chasquimq)."""

    name: str
    job_id: str | None
    job_name: str
    fields: dict[str, str]
    ts_ms: int = 0
    event_id: str = ""
