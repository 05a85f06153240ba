"""Who a worker is: its consumer name and the identity it beats with (``core/liveness.py``)."""

from __future__ import annotations

import os
import re
import socket
import uuid
from typing import Any

from ..core.liveness import MAX_HANDLERS

__all__ = ["consumer_name", "identity", "package_version"]

_HOST = re.compile(r"[^A-Za-z0-9.-]+")


def package_version() -> str:
    """This package's version (the package root reads its installed metadata; the consuming
    path imports no ``importlib``: tests/security/test_no_code_execution.py)."""
    from .. import version

    return version()


def consumer_name(host: str | None = None, pid: int | None = None) -> str:
    """``c-<host>-<pid>-<8 hex>``: who a consumer is, at a glance (host cut to 40 safe characters)."""
    safe = _HOST.sub("_", host if host is not None else socket.gethostname())[:40] or "host"
    return f"c-{safe}-{os.getpid() if pid is None else pid}-{uuid.uuid4().hex[:8]}"


def identity(
    *, handlers: list[str], concurrency: int, started_ms: int, lease_ms: int, version: str, kind: str = "worker"
) -> dict[str, Any]:
    """The record a worker beats with (its health and beat time are added per beat)."""
    names = sorted(handlers)
    if len(names) > MAX_HANDLERS:
        names = names[:MAX_HANDLERS] + [f"... {len(names) - MAX_HANDLERS} more"]
    return {
        "kind": kind,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "version": version,
        "handlers": names,
        "concurrency": concurrency,
        "started_ms": started_ms,
        "lease_ms": lease_ms,
    }
