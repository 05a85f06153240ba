"""Bulk loads from Spark: a DataFrame's rows become jobs (or repeatable specs).

Thin wrappers over the ``format("chasqui")`` data source (:mod:`.datasource`, docs/spark.md):
the driver validates the arguments against ``df.columns`` (a ``ConfigError`` before any Spark
job), projects the DataFrame to the columns it needs and writes it through the data source
under a fresh load id, so Arrow batches become envelopes and each chunk is one idempotent Lua
call; the count comes from the load's commit report in Redis (no accumulator, so the wrappers
work over Spark Connect too).  A retried or speculative Spark task writes each chunk once;
``job_id_col`` makes a whole re-run idempotent too (each id is added once per day).

Values are converted for msgpack: ``Decimal`` -> ``str`` (exact), ``date``/``datetime`` ->
ISO 8601 ``str``, struct -> ``dict``, binary -> ``bytes``, arrays and maps recursively.
Executors need this package installed (the same image, or ``--py-files``).

Imports pyspark only inside the functions (and never airflow), so importing it is cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.plain import to_plain
from ..core.urls import DEFAULT_URL
from ..errors import ConfigError, NotSupportedError

__all__ = ["enqueue_dataframe", "upsert_specs_dataframe", "to_plain", "DEFAULT_BATCH"]

log = logging.getLogger(__name__)

#: Rows per round trip (per ``add_bulk`` call, i.e. one Lua call per 1,000 of them).
DEFAULT_BATCH = 1000


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")
    return value


def _layout(
    df: Any,
    *,
    name: str | None,
    name_col: str | None,
    data_cols: Sequence[str] | None,
    data_col: str | None,
    extra: Mapping[str, str | None],
) -> tuple[list[str], list[str]]:
    """``(data columns, projected columns)``: the columns a dict payload is made of (empty with
    ``data_col``) and every column the write reads, after checking they exist."""
    if (name is None) == (name_col is None):
        raise ConfigError("give exactly one of name= (every row's job name) and name_col= (a column of names)")
    if data_cols is not None and data_col is not None:
        raise ConfigError(
            "give data_cols= (columns -> a dict payload) or data_col= (one column as the payload), not both"
        )
    columns = list(df.columns)
    used = [c for c in [name_col, data_col, *extra.values()] if c is not None]
    for col in used + list(data_cols or []):
        if col not in columns:
            raise ConfigError(f"column {col!r} is not in the DataFrame (columns: {columns})")
    if data_col is None and data_cols is None:
        data_cols = [c for c in columns if c not in used]
    projected = list(dict.fromkeys([*(c for c in used), *(data_cols or [])]))
    return list(data_cols or []), projected


def _option(value: Any) -> str:
    """A wrapper argument as a ``format("chasqui")`` option string."""
    import dataclasses
    import json

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
    if isinstance(value, Mapping):
        return json.dumps(dict(value))
    return str(value)


def _save(df: Any, queue: str, redis_url: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """``df.write.format("chasqui")`` with these options under a fresh load id; its commit report."""
    import uuid

    from .datasource import load_report, register

    register(df.sparkSession)
    load_id = uuid.uuid4().hex[:16]
    writer = df.write.format("chasqui").option("queue", queue).option("redis_url", redis_url).option("load_id", load_id)
    for key, value in options.items():
        if value is not None:
            writer = writer.option(key, _option(value))
    writer.mode("append").save()
    report = load_report(queue, load_id, redis_url=redis_url)
    if report is None:
        raise NotSupportedError(f"queue {queue}: the load {load_id} left no report (is Redis evicting keys?)")
    return report


def enqueue_dataframe(
    df: Any,
    queue: str,
    *,
    redis_url: str = DEFAULT_URL,
    name: str | None = None,
    name_col: str | None = None,
    data_cols: Sequence[str] | None = None,
    data_col: str | None = None,
    job_id_col: str | None = None,
    delay_ms_col: str | None = None,
    attempts: int | None = None,
    backoff: Any = None,
    batch: int = DEFAULT_BATCH,
    max_stream_len: int | None = None,
    priority_col: str | None = None,
    group_col: str | None = None,
) -> int:
    """Enqueue one job per row of ``df``; returns the number of rows enqueued.

    :param df: a ``pyspark.sql.DataFrame``; its partitions are written in parallel.
    :param queue: the queue name.
    :param redis_url: Redis as seen from the executors.
    :param name: one job name for every row; or ``name_col``: a string column of job names.
    :param data_cols: columns that make up each job's payload dict (default: every column not
        used for something else); or ``data_col``: one column (e.g. a struct) as the payload.
    :param job_id_col: caller-chosen job ids (idempotent adds; slower, see the module docstring).
    :param delay_ms_col: per-row delay in milliseconds (null = now).
    :param attempts: / :param backoff: retry options for every job (as ``Queue.add``).
    :param batch: rows per Lua call (the data source's ``chunk_size``, at most 10,000).
    :param max_stream_len: the stream's approximate cap (``MAXLEN ~``) for these writes; the
        default (1,000,000, ChasquiMQ's) trims the *oldest* entries of a longer backlog, so
        raise it for loads that may exceed it before workers catch up.
    :param priority_col: / :param group_col: each row's priority (an int, 1 the most urgent) or
        group (a tenant), null for none: that job waits beside the stream (docs/flow-control.md).
        Not with ``job_id_col`` or ``delay_ms_col``; a row may not have both.
    """
    _positive(batch, "batch")
    if max_stream_len is not None:
        _positive(max_stream_len, "max_stream_len")
    dict_cols, projected = _layout(
        df,
        name=name,
        name_col=name_col,
        data_cols=data_cols,
        data_col=data_col,
        extra={"job_id": job_id_col, "delay_ms": delay_ms_col, "priority": priority_col, "group": group_col},
    )
    constant = {k: v for k, v in (("attempts", attempts), ("backoff", backoff)) if v is not None}
    if constant:  # a bad retry option fails here on the driver, not in every task
        from ..types import build_retry_override

        build_retry_override(attempts, backoff)
    options: dict[str, Any] = {
        "name": name,
        "name_col": name_col,
        "data_col": data_col,
        "id_col": job_id_col,
        "delay_ms_col": delay_ms_col,
        "priority_col": priority_col,
        "group_col": group_col,
        "chunk_size": min(batch, 10_000),
        "max_stream_len": max_stream_len,
        **constant,
    }
    if data_col is None:
        options["data_cols"] = ",".join(dict_cols)
    rows = int(_save(df.select(*projected), queue, redis_url, options)["rows"])
    log.info("queue %s: enqueued %d rows from a DataFrame", queue, rows)
    return rows


def upsert_specs_dataframe(
    df: Any,
    queue: str,
    *,
    redis_url: str = DEFAULT_URL,
    name: str | None = None,
    name_col: str | None = None,
    key_col: str | None = None,
    cron_col: str | None = None,
    tz_col: str | None = None,
    every_ms_col: str | None = None,
    data_cols: Sequence[str] | None = None,
    data_col: str | None = None,
    attempts: int | None = None,
    backoff: Any = None,
    missed_fires: Any = None,
    priority_col: str | None = None,
    group_col: str | None = None,
    batch: int = DEFAULT_BATCH,
) -> int:
    """Create or replace one repeatable spec per row (the way millions of schedules are seeded).

    Each row needs a cron expression (``cron_col``, with an optional IANA zone in ``tz_col``) or
    an interval (``every_ms_col``); ``key_col`` names the spec (default: derived from the name
    and pattern, as ``upsert_repeatable_job`` does).  ``priority_col`` / ``group_col``: each
    spec's fires take that row's priority or group (null: none).  Written through the data
    source's ``kind=repeatable`` path (the scheduler's bulk upsert).  Returns the number of specs
    written.
    """
    _positive(batch, "batch")
    if cron_col is None and every_ms_col is None:
        raise ConfigError("give cron_col= (cron expressions) and/or every_ms_col= (intervals in ms)")
    if tz_col is not None and cron_col is None:
        raise ConfigError("tz_col= only applies with cron_col=")
    dict_cols, projected = _layout(
        df,
        name=name,
        name_col=name_col,
        data_cols=data_cols,
        data_col=data_col,
        extra={
            "key": key_col,
            "cron": cron_col,
            "tz": tz_col,
            "every_ms": every_ms_col,
            "priority": priority_col,
            "group": group_col,
        },
    )
    constant = {
        k: v for k, v in (("attempts", attempts), ("backoff", backoff), ("missed_fires", missed_fires)) if v is not None
    }
    if missed_fires is not None and not isinstance(missed_fires, str):
        raise ConfigError("missed_fires: pass the policy's name (skip, fire-once, fire-all)")
    options = {
        "kind": "repeatable",
        "name": name,
        "name_col": name_col,
        "key_col": key_col,
        "cron_col": cron_col,
        "tz_col": tz_col,
        "every_ms_col": every_ms_col,
        "priority_col": priority_col,
        "group_col": group_col,
        "data_col": data_col,
        **constant,
    }
    if data_col is None:
        options["data_cols"] = ",".join(dict_cols)
    rows = int(_save(df.select(*projected), queue, redis_url, options)["added"])
    log.info("queue %s: upserted %d repeatable specs from a DataFrame", queue, rows)
    return rows
