"""The error tree.  Everything the package raises on purpose derives from ChasquiError.

``UnrecoverableError`` and ``NotSupportedError`` keep the chasquimq base class
(``RuntimeError``) so ``except RuntimeError`` in code written for chasquimq still works.
Bad arguments raise ``ConfigError``, which is also a ``ValueError`` for the same reason.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ChasquiError",
    "ConfigError",
    "ConfigTypeError",
    "LimitError",
    "CodecError",
    "ScriptError",
    "BusyGroupError",
    "NoGroupError",
    "NoScriptError",
    "ReadOnlyReplicaError",
    "ClusterBusyError",
    "ChasquiConnectionError",
    "ReconnectLimitError",
    "JobNotFound",
    "JobFailed",
    "NotSupportedError",
    "UnrecoverableError",
    "HandlerNotFound",
    "RateLimited",
    "JobTimeout",
    "ChildProcessDied",
    "TRANSIENT_ERRORS",
]


class ChasquiError(Exception):
    """Root of every error this package raises on purpose."""


class ConfigError(ChasquiError, ValueError):
    """An argument or setting is invalid; the message names it and says why."""


class ConfigTypeError(ConfigError, TypeError):
    """An argument of the wrong type (e.g. a bool delay): a ``TypeError``, as chasquimq raises."""


class LimitError(ConfigError, RuntimeError):
    """A value over a wire limit (a job name over 256 bytes...): also a ``RuntimeError``, as
    chasquimq's native layer raises for the same input."""


class CodecError(ChasquiError, ValueError):
    """Bytes that should hold a ChasquiMQ envelope, member or spec do not decode."""


class ScriptError(ChasquiError):
    """Redis answered a script or a command with an error; the message is Redis' own.

    The drivers raise the subclasses below where callers branch on the kind of error
    (``drivers_common.translate_error`` is the one place that reads Redis' error text).
    """


class WrongTypeError(ScriptError):
    """A key holds another type than the command or script needs (Redis' ``WRONGTYPE``): foreign
    or hostile data in the queue's keyspace.  The message names the key."""


class BusyGroupError(ScriptError):
    """``XGROUP CREATE`` of a consumer group that exists (Redis' ``BUSYGROUP``)."""


class NoGroupError(ScriptError):
    """A consumer-group command on a group or stream that does not exist (Redis' ``NOGROUP``)."""


class NoScriptError(ScriptError):
    """The server holds no such script (``NOSCRIPT``) or function (``Function not found``).
    The drivers load it and run the call again; callers see it only from the load probe."""


class ReadOnlyReplicaError(ScriptError):
    """A write reached a replica (``READONLY``): a failover is under way; retry."""


class ClusterBusyError(ScriptError):
    """A cluster failing over (``CLUSTERDOWN``, ``TRYAGAIN``, ``MASTERDOWN``); retry."""


class ChasquiConnectionError(ChasquiError, ConnectionError):
    """Redis could not be reached (after the driver's own retries).

    The message never holds a secret: it goes through ``core.urls.redact_text`` (redis-py's
    Sentinel errors print connection reprs with ``password=...``).
    """

    def __init__(self, *args: object) -> None:
        from .core.urls import redact_text  # core imports this module

        super().__init__(*(redact_text(a) if isinstance(a, str) else a for a in args))


class ReconnectLimitError(ChasquiConnectionError):
    """A worker tried to reach Redis ``reconnect_max_attempts`` times in a row and gave up
    (chasquimq's option): its ``run()`` raises this once the drain is over."""


class JobNotFound(ChasquiError, LookupError):
    """No trace of the job id: never added, expired, or results were not stored."""


class JobFailed(ChasquiError, RuntimeError):
    """The awaited job ended in the dead-letter queue (a ``RuntimeError``, as chasquimq raises)."""

    def __init__(self, job_id: str, reason: str, detail: str = "", *, traceback: str = "") -> None:
        super().__init__(
            f"job {job_id} failed: {reason}"
            + (f" ({detail})" if detail else "")
            + (f"\nhandler traceback (from the worker):\n{traceback}" if traceback else "")
        )
        self.job_id = job_id
        self.reason = reason
        self.detail = detail
        #: the handler's formatted traceback (innermost frames; "" when none was stored)
        self.traceback = traceback

    def __reduce__(self) -> Any:  # crosses a process pool's pipe intact
        return _rebuild, (type(self), (self.job_id, self.reason, self.detail), {"traceback": self.traceback})


class NotSupportedError(ChasquiError, RuntimeError):
    """A chasquimq/BullMQ feature deliberately left out."""


class UnrecoverableError(ChasquiError, RuntimeError):
    """Raise from a handler to send the job straight to the DLQ (subclasses count too)."""


class HandlerNotFound(UnrecoverableError, LookupError):
    """A job arrived whose name has no registered handler.

    Raised by a worker's lookup of a job's handler (and ``HandlerRegistry.lookup``).  An
    ``UnrecoverableError``, so the worker dead-letters such a job at once (reason
    ``unrecoverable``, this error in its ``failed`` event and failure record).
    """

    @classmethod
    def for_name(cls, name: str) -> HandlerNotFound:
        """The error for job name ``name`` (one message for every lookup)."""
        return cls(f"no handler registered for job name {name!r}")


class RateLimited(ChasquiError):
    """Raise from a handler when a service said "too many requests" (an HTTP 429).

    The job goes back without counting an attempt and runs again later, and its queue starts
    nothing for ``retry_after_ms``: this worker at once, the others within 100 ms (they read the
    queue's controls that often).  ``retry_after_ms`` is 0 .. one day; anything else is a
    ``ConfigError`` (which, raised from a handler, fails the job as any error would).
    """

    MAX_MS = 86_400_000

    def __init__(self, retry_after_ms: int | float = 1000, message: str = "") -> None:
        if isinstance(retry_after_ms, bool) or not isinstance(retry_after_ms, (int, float)):
            raise ConfigError(f"retry_after_ms must be a number of milliseconds, got {retry_after_ms!r}")
        if not 0 <= retry_after_ms <= self.MAX_MS:  # NaN fails this too
            raise ConfigError(f"retry_after_ms must be between 0 and {self.MAX_MS:,}, got {retry_after_ms!r}")
        self.retry_after_ms = int(-(-retry_after_ms // 1))  # whole milliseconds, rounded up
        self._message = message
        super().__init__(message or f"rate limited: retry after {self.retry_after_ms} ms")

    def __reduce__(self) -> Any:  # crosses a process pool's pipe intact
        return _rebuild, (type(self), (self.retry_after_ms, self._message), {})


class JobTimeout(ChasquiError):
    """An attempt ran past its timeout (the job's ``timeout_ms``, its handler's or the worker's
    ``job_timeout_ms``) and was stopped: it fails with reason ``timeout`` and follows the retry
    policy like any failure."""

    def __init__(self, timeout_ms: int, job_id: str = "") -> None:
        self.timeout_ms, self.job_id = timeout_ms, job_id
        what = f"job {job_id}" if job_id else "the job"
        super().__init__(f"{what} ran past its timeout of {timeout_ms} ms")

    def __reduce__(self) -> Any:
        return _rebuild, (type(self), (self.timeout_ms, self.job_id), {})


class ChildProcessDied(ChasquiError):
    """The pool process running the job (``Worker(processes=N)``) died or passed its memory limit
    (``process_memory_mb``) before the handler returned; the attempt fails with this reason and
    follows the retry policy, and a fresh process takes the child's place."""


def _rebuild(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Unpickle an exception whose ``__init__`` takes other arguments than its ``args``."""
    return cls(*args, **kwargs)


TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (ChasquiConnectionError, ReadOnlyReplicaError, ClusterBusyError)
"""What a consumer waits out and retries: Redis unreachable, a failover under way (a write
reached a replica, a cluster moving slots).  Package errors only: code holding a raw redis-py
client passes its errors through ``drivers_common.translate_error`` first."""
