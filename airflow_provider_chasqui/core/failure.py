"""A dead-lettered job's failure record as the API returns it (public home: ``types``).

Lives in the core because the sans-I/O producer decodes the record; the core never imports upward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import CodecError
from .codec import decode_data

__all__ = ["JobFailure", "failure_record"]


@dataclass(frozen=True)
class JobFailure:
    """A dead-lettered job's failure record (kept by workers that store results, as
    ``chasqui worker`` does by default), as ``Queue.get_failure`` returns it.

    ``reason``: the DLQ reason (``retries_exhausted``, ``unrecoverable``...); ``error``: the
    handler's error (``handler: Python handler raised: ValueError('boom')``) or the DLQ detail;
    ``traceback``: the handler's formatted traceback, innermost frames kept (at most 4 KiB;
    ``""`` when none was recorded); ``finished_ms``: when it was dead-lettered (Unix ms).
    """

    job_id: str
    reason: str
    error: str
    traceback: str = ""
    finished_ms: int = 0


def failure_record(job_id: str, raw: Any) -> JobFailure | None:
    """A stored failure record ``[reason, detail, finished_ms(, traceback)]`` (the traceback
    since 0.x; older records have 3 elements); None when there is none or it cannot be read (a
    foreign or damaged key is shown as missing, never raised)."""
    if not isinstance(raw, (bytes, bytearray)):
        return None
    try:
        record = decode_data(bytes(raw))
    except (CodecError, TypeError, ValueError):
        return None
    if not isinstance(record, list) or len(record) < 2:
        return None
    finished = record[2] if len(record) > 2 and isinstance(record[2], int) else 0
    tb = str(record[3]) if len(record) > 3 and record[3] else ""
    return JobFailure(job_id, str(record[0]), str(record[1]), tb, finished)
