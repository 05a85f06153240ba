"""The ``format("chasqui")`` options, parsed and checked on the driver (no pyspark import).

Spark hands a data source its options as strings; everything here turns them into a frozen,
picklable plan that the executors' writers and readers run, so a bad option fails the
``save()``/``load()`` call on the driver with a :class:`ConfigError`, never in every task.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core.codec import MAX_JOB_ID_CHARS, RetryOverride, validate_job_name
from ...core.keys import validate_queue_name
from ...core.running import check_timeout_ms
from ...core.settings import QueueSettings
from ...core.urls import DEFAULT_URL, check_url, redact_url
from ...errors import ConfigError
from ...types import build_retry_override

__all__ = ["DEFAULT_CHUNK", "DEFAULT_DEDUP_TTL_S", "ENV_URL", "MAX_DEDUP_TTL_S", "WritePlan", "redis_url", "write_plan"]

#: Environment variable read (on the driver) when no ``redis_url`` option is given.
ENV_URL = "CHASQUI_REDIS_URL"
#: Rows per script call (and per idempotency marker).
DEFAULT_CHUNK = 500
#: How long a written chunk's (or id's) marker suppresses a re-run: one day.
DEFAULT_DEDUP_TTL_S = 24 * 3600
MAX_DEDUP_TTL_S = 3650 * 86_400  # ten years: the marker's PX must fit Redis' long long

_WRITE_KEYS = {
    "queue",
    "redis_url",
    "kind",
    "name",
    "name_col",
    "data_col",
    "data_cols",
    "id_col",
    "delay_ms_col",
    "run_at_col",
    "priority_col",
    "group_col",
    "attempts",
    "backoff",
    "load_id",
    "chunk_size",
    "dedup_ttl_s",
    "max_stream_len",
    "timeout_ms",
    "path",
}
_INTEGRAL = ("byte", "short", "integer", "long")
_TIMESTAMPS = ("timestamp", "timestamp_ntz", "date")


def redis_url(options: Mapping[str, str]) -> str:
    """The ``redis_url`` option, else ``$CHASQUI_REDIS_URL``, else the local default."""
    url = options.get("redis_url") or os.environ.get(ENV_URL) or DEFAULT_URL
    try:
        return check_url(url)
    except ConfigError as exc:
        raise ConfigError(f"chasqui: bad redis_url {redact_url(url)}: {exc}") from None


def _int(
    options: Mapping[str, str], key: str, default: int | None, *, minimum: int = 1, maximum: int = 2**63 - 1
) -> int | None:
    raw = options.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"chasqui: option {key} must be an integer, got {raw!r}") from None
    if not minimum <= value <= maximum:
        raise ConfigError(f"chasqui: option {key} must be from {minimum} to {maximum:,}, got {value}")
    return value


def _backoff(raw: str | None) -> Any:
    if raw is None or raw == "":
        return None
    text = str(raw).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        value = json.loads(text)
    except ValueError:
        raise ConfigError(
            f"chasqui: option backoff must be ms or a JSON object like "
            f'{{"kind": "exponential", "delay_ms": 1000}}, got {raw!r}'
        ) from None
    return value


@dataclass(frozen=True)
class WritePlan:
    """What each write task does: where, which columns mean what, how ids are made."""

    queue: str
    url: str
    name: str | None  # every row's job name, or
    name_col: str | None  # a string column of names
    data_col: str | None  # one column as the payload, or
    data_cols: tuple[str, ...]  # these columns as a dict
    id_col: str | None
    delay_ms_col: str | None
    run_at_col: str | None
    retry: RetryOverride | None
    load_id: str
    chunk_size: int
    dedup_ttl_ms: int
    settings: QueueSettings
    timeout_ms: int | None = None  # every job's own timeout (core/running.py)
    priority_col: str | None = None  # each row's priority (null: none), or
    group_col: str | None = None  # each row's group: such a row waits beside the stream

    @property
    def side(self) -> bool:
        return self.priority_col is not None or self.group_col is not None

    def describe(self) -> str:
        """For messages: never the URL's password."""
        return f"queue {self.queue!r} on {redact_url(self.url)} (load_id {self.load_id})"


def _column(schema: Any, col: str | None, what: str, types: tuple[str, ...] | None = None) -> None:
    if col is None:
        return
    fields = {f.name: f for f in schema.fields}
    if col not in fields:
        raise ConfigError(f"chasqui: option {what}={col!r} is not a column (columns: {list(fields)})")
    if types is not None and fields[col].dataType.typeName() not in types:
        raise ConfigError(
            f"chasqui: column {col!r} ({what}) is {fields[col].dataType.simpleString()}; expected {' or '.join(types)}"
        )


def write_plan(options: Mapping[str, str], schema: Any, *, load_id: str | None = None) -> WritePlan:  # noqa: PLR0915 - one check per write option, in the order the docs list them
    """Check the options against the DataFrame's schema (a ``StructType``)."""
    unknown = sorted(k for k in (k.lower() for k in options) if k not in _WRITE_KEYS)
    if unknown:
        raise ConfigError(f"chasqui: unknown write options {unknown}; known: {sorted(_WRITE_KEYS)}")
    queue = options.get("queue") or options.get("path")
    if not queue:
        raise ConfigError('chasqui: give the queue: .option("queue", "<name>")')
    validate_queue_name(queue)
    url = redis_url(options)
    name, name_col = options.get("name"), options.get("name_col")
    if (name is None) == (name_col is None):
        raise ConfigError(
            "chasqui: give exactly one of the options name (every row's job name) and name_col "
            "(a string column of names)"
        )
    if name is not None:
        validate_job_name(name)
    data_col, data_cols_raw = options.get("data_col"), options.get("data_cols")
    if data_col is not None and data_cols_raw is not None:
        raise ConfigError(
            "chasqui: give data_col (one column as the payload) or data_cols (columns -> a dict), not both"
        )
    id_col, delay_col, run_at_col = options.get("id_col"), options.get("delay_ms_col"), options.get("run_at_col")
    if delay_col is not None and run_at_col is not None:
        raise ConfigError("chasqui: give delay_ms_col or run_at_col, not both")
    _column(schema, name_col, "name_col", ("string",))
    _column(schema, data_col, "data_col")
    _column(schema, id_col, "id_col", ("string", *_INTEGRAL))
    _column(schema, delay_col, "delay_ms_col", _INTEGRAL)
    _column(schema, run_at_col, "run_at_col", _TIMESTAMPS)
    priority_col, group_col = options.get("priority_col"), options.get("group_col")
    _column(schema, priority_col, "priority_col", _INTEGRAL)
    _column(schema, group_col, "group_col", ("string",))
    if priority_col is not None or group_col is not None:
        placed = [k for k, v in (("id_col", id_col), ("delay_ms_col", delay_col), ("run_at_col", run_at_col)) if v]
        if placed:
            raise ConfigError(
                f"chasqui: priority_col and group_col cannot be combined with {', '.join(placed)} (such a job "
                "waits beside the stream, added now, as Queue.add(priority=/group=) refuses delay and job_id)"
            )
    used = {c for c in (name_col, data_col, id_col, delay_col, run_at_col, priority_col, group_col) if c is not None}
    if data_cols_raw is not None:
        data_cols = tuple(c.strip() for c in data_cols_raw.split(",") if c.strip())
        for c in data_cols:
            _column(schema, c, "data_cols")
    elif data_col is None:
        data_cols = tuple(f.name for f in schema.fields if f.name not in used)
    else:
        data_cols = ()
    attempts = _int(options, "attempts", None, minimum=0)
    retry = build_retry_override(attempts, _backoff(options.get("backoff")))
    load = options.get("load_id") or load_id or uuid.uuid4().hex[:16]
    if len(load) > 200 or any(ch in load for ch in "{}\r\n\0"):
        raise ConfigError(f"chasqui: load_id must be at most 200 characters without braces, got {load[:50]!r}")
    max_len = _int(options, "max_stream_len", None)
    settings = QueueSettings(max_stream_len=max_len) if max_len is not None else QueueSettings()
    chunk = _int(options, "chunk_size", DEFAULT_CHUNK)
    assert chunk is not None
    if chunk > 10_000:
        raise ConfigError(f"chasqui: chunk_size is at most 10000 rows per script call, got {chunk}")
    ttl = _int(options, "dedup_ttl_s", DEFAULT_DEDUP_TTL_S, maximum=MAX_DEDUP_TTL_S)
    assert ttl is not None
    timeout = _timeout(options.get("timeout_ms"))
    return WritePlan(
        queue=queue,
        url=url,
        name=name,
        name_col=name_col,
        data_col=data_col,
        data_cols=data_cols,
        id_col=id_col,
        delay_ms_col=delay_col,
        run_at_col=run_at_col,
        retry=retry,
        load_id=load,
        chunk_size=chunk,
        dedup_ttl_ms=ttl * 1000,
        settings=settings,
        timeout_ms=timeout,
        priority_col=priority_col,
        group_col=group_col,
    )


def _timeout(raw: str | None) -> int | None:
    """The ``timeout_ms`` option (a string, as Spark options are): ``check_timeout_ms``'s bounds."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"chasqui: timeout_ms must be a number of milliseconds, got {raw!r}") from None
    return check_timeout_ms(value, "chasqui: timeout_ms")


assert MAX_JOB_ID_CHARS >= 256  # derived ids (load_id + partition + row) stay well within it
