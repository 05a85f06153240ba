"""``df.write.format("chasqui").option("kind", "repeatable")``: rows become repeatable specs.

Each task turns its Arrow batches into ``upsert_repeatable_bulk`` items (cron + optional zone,
or an interval), checks every row on its own before anything of its chunk is sent, and upserts
the good ones through the scheduler's bulk path (one script call per 1,000 specs).  A bad row
(invalid cron, unknown zone, both or neither pattern) is reported with its partition, row and
key: ``on_error=fail`` (default) fails the task, after the chunks before it were written
(upserts are idempotent: fix the rows and run again); ``on_error=skip`` writes the good rows
and counts the bad ones in the commit report (the first 20 errors are kept).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ...core.codec import now_ms, validate_job_name
from ...core.keys import validate_queue_name
from ...core.repeat import RepeatPattern
from ...core.schedules import SpecFlows
from ...core.settings import QueueSettings
from ...errors import ChasquiError, ConfigError
from ...types import coerce_backoff
from .encode import PartitionReport, plain_column
from .options import MAX_DEDUP_TTL_S, _backoff, _int, redis_url
from .writer import _task, finish

__all__ = ["SpecPlan", "spec_plan", "ChasquiSpecWriter"]

_SPEC_KEYS = {
    "queue",
    "redis_url",
    "kind",
    "name",
    "name_col",
    "key_col",
    "cron_col",
    "tz_col",
    "every_ms_col",
    "priority_col",
    "group_col",
    "data_col",
    "data_cols",
    "attempts",
    "backoff",
    "missed_fires",
    "on_error",
    "load_id",
    "path",
    "dedup_ttl_s",
}
_CHUNK = 1000
_KEEP_ERRORS = 20


@dataclass(frozen=True)
class SpecPlan:
    queue: str
    url: str
    name: str | None
    name_col: str | None
    key_col: str | None
    cron_col: str | None
    tz_col: str | None
    every_ms_col: str | None
    data_col: str | None
    data_cols: tuple[str, ...]
    sides: tuple[tuple[str, str], ...]  # ("priority" | "group", column): every fire's side lane
    constant: tuple[tuple[str, Any], ...]
    on_error: str
    load_id: str
    dedup_ttl_ms: int
    settings: QueueSettings

    # what ``finish`` reads
    def describe(self) -> str:
        from ...core.urls import redact_url

        return f"queue {self.queue!r} on {redact_url(self.url)} (specs, load_id {self.load_id})"


def spec_plan(options: Mapping[str, str], schema: Any) -> SpecPlan:
    import uuid

    unknown = sorted(k for k in options if k not in _SPEC_KEYS)
    if unknown:
        raise ConfigError(f"chasqui: unknown options for kind=repeatable {unknown}; known: {sorted(_SPEC_KEYS)}")
    queue = options.get("queue") or options.get("path")
    if not queue:
        raise ConfigError('chasqui: give the queue: .option("queue", "<name>")')
    validate_queue_name(queue)
    columns = [f.name for f in schema.fields]
    name, name_col = options.get("name"), options.get("name_col")
    if (name is None) == (name_col is None):
        raise ConfigError("chasqui: give exactly one of the options name and name_col")
    if name is not None:
        validate_job_name(name)
    cron_col, every_col = options.get("cron_col"), options.get("every_ms_col")
    if cron_col is None and every_col is None:
        raise ConfigError("chasqui: kind=repeatable needs cron_col (cron expressions) and/or every_ms_col (intervals)")
    tz_col = options.get("tz_col")
    if tz_col is not None and cron_col is None:
        raise ConfigError("chasqui: tz_col only applies with cron_col")
    key_col, data_col = options.get("key_col"), options.get("data_col")
    side = {"priority": options.get("priority_col"), "group": options.get("group_col")}
    sides = tuple((k, c) for k, c in side.items() if c is not None)
    used = [c for c in (name_col, key_col, cron_col, tz_col, every_col, data_col, *side.values()) if c is not None]
    raw_cols = options.get("data_cols")
    data_cols = tuple(c.strip() for c in raw_cols.split(",") if c.strip()) if raw_cols else ()
    for col in used + list(data_cols):
        if col not in columns:
            raise ConfigError(f"chasqui: column {col!r} is not in the DataFrame (columns: {columns})")
    if data_col is None and not raw_cols:
        data_cols = tuple(c for c in columns if c not in used)
    on_error = options.get("on_error", "fail")
    if on_error not in ("fail", "skip"):
        raise ConfigError(f"chasqui: option on_error must be fail or skip, got {on_error!r}")
    attempts = _int(options, "attempts", None, minimum=0)
    backoff = _backoff(options.get("backoff"))
    coerce_backoff(backoff)
    constant = tuple(
        (k, v)
        for k, v in (("attempts", attempts), ("backoff", backoff), ("missed_fires", options.get("missed_fires")))
        if v is not None
    )
    ttl = _int(options, "dedup_ttl_s", 24 * 3600, maximum=MAX_DEDUP_TTL_S)
    assert ttl is not None
    return SpecPlan(
        queue=queue,
        url=redis_url(options),
        name=name,
        name_col=name_col,
        key_col=key_col,
        cron_col=cron_col,
        tz_col=tz_col,
        every_ms_col=every_col,
        data_col=data_col,
        data_cols=data_cols,
        sides=sides,
        constant=constant,
        on_error=on_error,
        load_id=options.get("load_id") or uuid.uuid4().hex[:16],
        dedup_ttl_ms=ttl * 1000,
        settings=QueueSettings(),
    )


@dataclass
class SpecReport(PartitionReport, WriterCommitMessage):
    bad: int = 0
    errors: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "bad": self.bad, "errors": list(self.errors)}


def _items(plan: SpecPlan, batch: Any) -> list[dict[str, Any]]:
    n = batch.num_rows

    def col(name: str | None) -> list[Any]:
        return [None] * n if name is None else plain_column(batch.column(name))

    if plan.data_col is not None:
        datas = col(plan.data_col)
    else:
        cols = [col(c) for c in plan.data_cols]
        datas = [dict(zip(plan.data_cols, vals)) for vals in zip(*cols)] if cols else [{} for _ in range(n)]
    names = [plan.name] * n if plan.name is not None else col(plan.name_col)
    out = []
    const = dict(plan.constant)
    for name, data, key, cron, tz, every in zip(
        names, datas, col(plan.key_col), col(plan.cron_col), col(plan.tz_col), col(plan.every_ms_col)
    ):
        item: dict[str, Any] = {"name": name, "data": data, **const, "_cron": cron, "_tz": tz, "_every": every}
        if key is not None:
            item["key"] = str(key)
        out.append(item)
    for option, column in plan.sides:  # a row's priority or group (null: none; checked per row)
        for item, value in zip(out, col(column)):
            if value is not None:
                item[option] = value
    return out


def _pattern(item: dict[str, Any]) -> dict[str, Any]:
    cron, tz, every = item.pop("_cron"), item.pop("_tz"), item.pop("_every")
    if (cron is None) == (every is None):
        raise ConfigError(
            f"give exactly one of a cron expression and an every_ms interval, got cron={cron!r} every_ms={every!r}"
        )
    item["repeat"] = RepeatPattern.cron(cron, tz=tz) if cron is not None else RepeatPattern.every(int(every))
    return item


class ChasquiSpecWriter(DataSourceArrowWriter):
    def __init__(self, plan: SpecPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        from ...sync.queue import SyncQueue

        plan = self.plan
        partition, attempt, _ctx = _task()
        report = SpecReport(partition=partition, attempt=attempt)
        flows = SpecFlows(plan.queue, plan.settings)
        errors: list[str] = []
        with SyncQueue(plan.queue, redis_url=plan.url, settings=plan.settings) as q:
            for batch in iterator:
                items = _items(plan, batch)
                for lo in range(0, len(items), _CHUNK):
                    good = []
                    for i, item in enumerate(items[lo : lo + _CHUNK], start=report.rows + lo):
                        try:
                            checked = _pattern(item)
                            flows._bulk_argv([dict(checked)], now_ms(), ({}, {}))  # the upsert's own checks
                        except (ConfigError, ValueError, TypeError) as exc:
                            text = f"partition {partition} row {i} (key {item.get('key')!r}): {exc}"
                            if plan.on_error == "fail":
                                raise ConfigError(
                                    f"chasqui: {text} -- the {report.added} specs before it in this partition were "
                                    "written (upserts are idempotent: fix the rows and run again, or set "
                                    'option("on_error", "skip"))'
                                ) from None
                            report.bad += 1
                            if len(errors) < _KEEP_ERRORS:
                                errors.append(text)
                            continue
                        good.append(checked)
                    if good:
                        try:
                            q.upsert_repeatable_bulk(good)
                        except Exception as exc:
                            raise ChasquiError(
                                f"chasqui: partition {partition}: {exc} -- {report.added} specs were written before it"
                            ) from exc
                        report.added += len(good)
                        report.chunks += 1
                report.rows += batch.num_rows
        report.errors = tuple(errors)
        return report

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        finish(self.plan, self.plan.load_id, messages, "committed")  # type: ignore[arg-type]

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        finish(self.plan, self.plan.load_id, messages, "aborted")  # type: ignore[arg-type]
