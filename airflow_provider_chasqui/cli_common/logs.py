"""Log formats of the worker process: the human line (default) and JSON, one object per line.

``chasqui worker --log-format json`` (or ``CHASQUI_LOG_FORMAT=json``) selects
:class:`JsonFormatter`: every record becomes one line holding a JSON object, for log
shippers (Loki, Elasticsearch, CloudWatch) that index fields instead of parsing text::

    {"ts": "2026-11-23T17:02:06.123Z", "level": "WARNING", "logger": "airflow_provider_chasqui.engine.worker",
     "message": "worker c-...: job 01J... send attempt 1 failed: ...", "pid": 4242, "queue": "emails",
     "job_id": "01J...", "job_name": "send", "attempt": 1, "exception": "Traceback ..."}

``queue``, ``job_id``, ``job_name`` and ``attempt`` come from the record's attributes (the
worker passes them with ``extra=``), ``queue`` else from :func:`set_log_context`;
``trace_id`` and ``span_id`` likewise from the record's attributes when a tracing
integration (a logging filter, or ``extra=``) sets them.  Keys whose value is unknown are
left out.  Like the human format, the output is redacted (:func:`..core.urls.redact_text`):
no password or token reaches the log, tracebacks included.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from ..core.text import printable
from ..core.urls import redact_text

__all__ = ["LOG_FORMATS", "HUMAN_FORMAT", "JsonFormatter", "RedactingFormatter", "set_log_context", "formatter_spec"]

LOG_FORMATS = ("human", "json")
HUMAN_FORMAT = "%(asctime)s %(levelname)-7s %(name)s [%(process)d]: %(message)s"
#: Record attributes copied into a JSON line when set (the worker's ``extra=`` and tracing hooks).
CONTEXT_FIELDS = ("queue", "job_id", "job_name", "attempt", "trace_id", "span_id")

_context: dict[str, Any] = {}


def set_log_context(**fields: Any) -> None:
    """Process-wide defaults for the JSON fields (the worker's ``queue``); None removes one."""
    for key, value in fields.items():
        if value is None:
            _context.pop(key, None)
        else:
            _context[key] = value


class RedactingFormatter(logging.Formatter):
    """The human format: its output (message, traceback, stack) never holds a password or token,
    and a message is one line: control characters in job names or handler errors are escaped
    (``core.text.printable``), so they can neither forge a log line nor drive a terminal; a
    traceback keeps its own newlines."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return printable(super().formatException(ei), keep_newlines=True)

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info), keep_newlines=True)


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in messages and tracebacks are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": redact_text(record.getMessage()),
            "pid": record.process,
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is None:
                value = _context.get(key)
            if value is not None and value != "":
                out[key] = value if isinstance(value, (int, float, bool)) else redact_text(value)
        if record.exc_info:
            out["exception"] = redact_text(self.formatException(record.exc_info))
        elif record.exc_text:
            out["exception"] = redact_text(record.exc_text)
        if record.stack_info:
            out["stack"] = redact_text(self.formatStack(record.stack_info))
        return json.dumps(out, ensure_ascii=False, default=str)


def formatter_spec(fmt: str) -> dict[str, Any]:
    """The ``logging.dictConfig`` formatter for a ``--log-format`` value."""
    if fmt == "json":
        return {"()": JsonFormatter}
    if fmt == "human":
        return {"()": RedactingFormatter, "fmt": HUMAN_FORMAT}
    raise ValueError(f"unknown log format {fmt!r}; expected one of {LOG_FORMATS}")
