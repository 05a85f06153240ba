"""Bulk loads from Spark: a DataFrame's rows become jobs (or repeatable specs), written per partition.

Theory of operation.  The driver validates the arguments against ``df.columns``, projects the
DataFrame to the columns it needs and runs one ``foreachPartition``.  Each partition (a Spark
task, on an executor) opens its own :class:`~airflow_provider_chasqui.SyncQueue`, turns rows
into ``add_bulk`` dicts and sends them ``batch`` rows at a time: one pipelined round trip per
batch carrying one Lua script call per 1,000 jobs (the engine's bulk path), so the Redis work
is per batch, not per row.  An accumulator counts the rows written; Spark applies each
successful task's update once.

Delivery is at least once: a Spark task that fails half way and is retried writes its
partition again.  Give ``job_id_col`` (immediate adds with a caller id are deduplicated for
the queue's ``unique_window_ms``, delayed ones for as long as they wait) when duplicates
matter; those rows go one script call each, so they load slower.

Values are converted for msgpack: ``Decimal`` -> ``str`` (exact), ``date``/``datetime`` ->
ISO 8601 ``str``, ``Row``/struct -> ``dict``, ``bytearray`` -> ``bytes``, arrays and maps
recursively.  Executors need this package installed (the same image, or ``--py-files``).

Imports pyspark only inside the functions (and never airflow), so importing it is cheap.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..engine.queue import DEFAULT_URL
from ..errors import ConfigError, NotSupportedError

__all__ = ["enqueue_dataframe", "upsert_specs_dataframe", "to_plain", "DEFAULT_BATCH"]

log = logging.getLogger(__name__)

#: Rows per round trip (per ``add_bulk`` call, i.e. one Lua call per 1,000 of them).
DEFAULT_BATCH = 1000
_SIMPLE = frozenset((str, int, float, bool, type(None), bytes))


def to_plain(value: Any) -> Any:
    """A Spark value as something msgpack encodes (see the module docstring for the rules)."""
    cls = value.__class__
    if cls in _SIMPLE:
        return value
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, bytearray):
        return bytes(value)
    if hasattr(value, "asDict") and isinstance(value, tuple):  # pyspark.sql.Row
        return {k: to_plain(v) for k, v in value.asDict(recursive=False).items()}
    if isinstance(value, Mapping):
        return {to_plain(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, (str, int, float)):  # subclasses (numpy scalars are not)
        return value
    raise ConfigError(f"a {cls.__name__} value cannot be put in a job payload")


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")
    return value


@dataclass(frozen=True)
class _Layout:
    """Which projected column holds what (positions into each Row); picklable, built on the driver."""

    columns: tuple[str, ...]
    name: str | None
    name_idx: int | None
    data_idx: tuple[tuple[str, int], ...]
    data_whole_idx: int | None
    extra_idx: tuple[tuple[str, int], ...]  # (add_bulk/spec key, column position)

    def row_name(self, row: Any) -> str:
        if self.name_idx is None:
            assert self.name is not None
            return self.name
        value = row[self.name_idx]
        if not isinstance(value, str) or not value:
            raise ConfigError(f"column {self.columns[self.name_idx]!r} holds {value!r}: a job name must be a "
                              "non-empty string")
        return value

    def row_data(self, row: Any) -> Any:
        if self.data_whole_idx is not None:
            return to_plain(row[self.data_whole_idx])
        return {col: to_plain(row[i]) for col, i in self.data_idx}


def _layout(df: Any, *, name: str | None, name_col: str | None, data_cols: Sequence[str] | None,
            data_col: str | None, extra: Mapping[str, str | None]) -> tuple[_Layout, list[str]]:
    if (name is None) == (name_col is None):
        raise ConfigError("give exactly one of name= (every row's job name) and name_col= (a column of names)")
    if data_cols is not None and data_col is not None:
        raise ConfigError("give data_cols= (columns -> a dict payload) or data_col= (one column as the payload), "
                          "not both")
    columns = list(df.columns)
    used = [c for c in [name_col, data_col, *extra.values()] if c is not None]
    for col in used + list(data_cols or []):
        if col not in columns:
            raise ConfigError(f"column {col!r} is not in the DataFrame (columns: {columns})")
    if data_col is None and data_cols is None:
        data_cols = [c for c in columns if c not in used]
    projected = list(dict.fromkeys([*(c for c in used), *(data_cols or [])]))
    pos = {c: i for i, c in enumerate(projected)}
    layout = _Layout(
        columns=tuple(projected),
        name=name,
        name_idx=None if name_col is None else pos[name_col],
        data_idx=tuple((c, pos[c]) for c in (data_cols or [])),
        data_whole_idx=None if data_col is None else pos[data_col],
        extra_idx=tuple((key, pos[col]) for key, col in extra.items() if col is not None),
    )
    return layout, projected


class _PartitionWriter:
    """The function ``foreachPartition`` runs: rows -> ``add_bulk`` batches on its own SyncQueue."""

    def __init__(self, queue: str, redis_url: str, layout: _Layout, batch: int, constant: dict[str, Any],
                 counter: Any, mode: str, max_stream_len: int | None = None) -> None:
        self.queue, self.redis_url, self.layout = queue, redis_url, layout
        self.batch, self.constant, self.counter, self.mode = batch, constant, counter, mode
        self.max_stream_len = max_stream_len

    def __call__(self, rows: Iterable[Any]) -> None:
        from ..sync.queue import SyncQueue

        layout, constant = self.layout, self.constant
        pending: list[dict[str, Any]] = []
        written = 0
        with SyncQueue(self.queue, redis_url=self.redis_url, max_stream_len=self.max_stream_len) as queue:
            send = self._sender(queue)
            for spark_row in rows:
                row = tuple(spark_row)  # Row.__getitem__ is Python code; a plain tuple indexes in C
                item = {"name": layout.row_name(row), "data": layout.row_data(row), **constant}
                for key, i in layout.extra_idx:
                    value = row[i]
                    if value is not None:
                        item[key] = value
                pending.append(self._shape(item))
                if len(pending) >= self.batch:
                    send(pending)
                    written += len(pending)
                    pending = []
            if pending:
                send(pending)
                written += len(pending)
        self.counter.add(written)

    def _shape(self, item: dict[str, Any]) -> dict[str, Any]:
        if self.mode != "specs":
            return item
        from ..core.repeat import RepeatPattern

        cron, every, tz = item.pop("cron", None), item.pop("every_ms", None), item.pop("tz", None)
        if (cron is None) == (every is None):
            raise ConfigError(f"spec {item.get('key') or item['name']!r}: give exactly one of a cron expression and "
                              f"an every_ms interval, got cron={cron!r} every_ms={every!r}")
        item["repeat"] = RepeatPattern.cron(cron, tz=tz) if cron is not None else RepeatPattern.every(int(every))
        return item

    def _sender(self, queue: Any) -> Any:
        if self.mode == "jobs":
            return queue.add_bulk
        bulk = getattr(queue, "upsert_repeatable_bulk", None)
        if bulk is not None:
            return bulk

        def one_by_one(items: list[dict[str, Any]]) -> None:
            for item in items:
                queue.upsert_repeatable_job(item.pop("name"), item.pop("data"), **item)

        return one_by_one


def _run(df: Any, writer_args: dict[str, Any]) -> int:
    sc = df.sparkSession.sparkContext
    counter = sc.accumulator(0)
    writer = _PartitionWriter(counter=counter, **writer_args)
    df.foreachPartition(writer)
    return int(counter.value)


def enqueue_dataframe(df: Any, queue: str, *, redis_url: str = DEFAULT_URL, name: str | None = None,
                      name_col: str | None = None, data_cols: Sequence[str] | None = None,
                      data_col: str | None = None, job_id_col: str | None = None, delay_ms_col: str | None = None,
                      attempts: int | None = None, backoff: Any = None, batch: int = DEFAULT_BATCH,
                      max_stream_len: int | None = None) -> int:
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
    :param batch: rows per pipelined round trip (one Lua call per 1,000 rows inside it).
    :param max_stream_len: the stream's approximate cap (``MAXLEN ~``) for these writes; the
        default (1,000,000, ChasquiMQ's) trims the *oldest* entries of a longer backlog, so
        raise it for loads that may exceed it before workers catch up.
    """
    _positive(batch, "batch")
    if max_stream_len is not None:
        _positive(max_stream_len, "max_stream_len")
    layout, projected = _layout(df, name=name, name_col=name_col, data_cols=data_cols, data_col=data_col,
                                extra={"job_id": job_id_col, "delay_ms": delay_ms_col})
    constant = {k: v for k, v in (("attempts", attempts), ("backoff", backoff)) if v is not None}
    if constant:  # a bad retry option fails here on the driver, not in every task
        from ..types import build_retry_override

        build_retry_override(attempts, backoff)
    rows = _run(df.select(*projected), dict(queue=queue, redis_url=redis_url, layout=layout, batch=batch,
                                            constant=constant, mode="jobs", max_stream_len=max_stream_len))
    log.info("queue %s: enqueued %d rows from a DataFrame", queue, rows)
    return rows


def upsert_specs_dataframe(df: Any, queue: str, *, redis_url: str = DEFAULT_URL, name: str | None = None,
                           name_col: str | None = None, key_col: str | None = None, cron_col: str | None = None,
                           tz_col: str | None = None, every_ms_col: str | None = None,
                           data_cols: Sequence[str] | None = None, data_col: str | None = None,
                           attempts: int | None = None, backoff: Any = None, missed_fires: Any = None,
                           batch: int = DEFAULT_BATCH) -> int:
    """Create or replace one repeatable spec per row (the way millions of schedules are seeded).

    Each row needs a cron expression (``cron_col``, with an optional IANA zone in ``tz_col``) or
    an interval (``every_ms_col``); ``key_col`` names the spec (default: derived from the name
    and pattern, as ``upsert_repeatable_job`` does).  Written with
    ``SyncQueue.upsert_repeatable_bulk`` per batch.  Returns the number of specs written.
    """
    from ..sync.queue import SyncQueue

    if not hasattr(SyncQueue, "upsert_repeatable_bulk") and not hasattr(SyncQueue, "upsert_repeatable_job"):
        raise NotSupportedError("this build's SyncQueue has no upsert_repeatable_bulk/upsert_repeatable_job yet")
    if not hasattr(SyncQueue, "upsert_repeatable_bulk"):
        log.warning("SyncQueue.upsert_repeatable_bulk is missing: writing specs one call each (slow)")
    _positive(batch, "batch")
    if cron_col is None and every_ms_col is None:
        raise ConfigError("give cron_col= (cron expressions) and/or every_ms_col= (intervals in ms)")
    if tz_col is not None and cron_col is None:
        raise ConfigError("tz_col= only applies with cron_col=")
    layout, projected = _layout(df, name=name, name_col=name_col, data_cols=data_cols, data_col=data_col,
                                extra={"key": key_col, "cron": cron_col, "tz": tz_col, "every_ms": every_ms_col})
    constant = {k: v for k, v in (("attempts", attempts), ("backoff", backoff), ("missed_fires", missed_fires))
                if v is not None}
    rows = _run(df.select(*projected), dict(queue=queue, redis_url=redis_url, layout=layout, batch=batch,
                                            constant=constant, mode="specs"))
    log.info("queue %s: upserted %d repeatable specs from a DataFrame", queue, rows)
    return rows
