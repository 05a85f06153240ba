"""Arrow record batches -> job envelopes and the idempotent chunk calls (no pyspark import).

Theory of operation.  A write task (one DataFrame partition) receives Arrow record batches.
Each column is turned into Python values once per batch (``Array.to_pylist``, with a per-value
conversion only for the types msgpack cannot take: decimals, dates and timestamps, nested
values holding them), the payload dicts are zipped together in C, and every row's envelope is
the core codec's ``encode_new_envelope``.  Rows are cut into chunks of ``chunk_size`` counted
from the partition's first row, and each chunk is one script call, streamed on one connection
while the next chunk is encoded (the engine's bulk path):

* without ``id_col`` the ids are ``<load_id>-<partition>-<row>`` and the chunk carries one
  marker ``{chasqui:<q>}:unique:spark:<load_id>:<partition>:<chunk>`` set in the same script
  (``lua/enqueue_batch_once.lua``): a re-run of the task (a Spark retry, a speculative copy,
  the same load run again with the same ``load_id``) finds the marker and writes nothing for
  that chunk, so every row becomes exactly one job while the markers live (``dedup_ttl_s``);
* with ``id_col`` every job holds its own marker, the key ``Queue.add_unique`` uses
  (``lua/enqueue_batch_unique.lua``), for ``dedup_ttl_s``: the same id is never added twice
  in that time, whichever load or producer added it first;
* with ``priority_col`` or ``group_col`` (not with ``id_col`` or a delay) the chunk's marker
  works as without ``id_col``, and a row with a priority or a group waits beside the stream
  (``lua/enqueue_batch_side_once.lua``), as ``Queue.add(priority=/group=)`` puts it.

Both need the partition's rows in the same order on a re-run, which Spark gives for
deterministic plans (``repartition(n)`` sorts first unless ``spark.sql.execution.
sortBeforeRepartition`` is off); a non-deterministic source should write with ``id_col``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, cast

from ...core.calls import Call, script_call
from ...core.codec import (
    MAX_JOB_ID_CHARS,
    encode_data,
    encode_member,
    encode_new_envelope,
    now_ms,
    packb,
    validate_job_name,
)
from ...core.groups import check_group
from ...core.keys import QueueKeys
from ...core.priorities import check_priority
from ...core.running import timeout_calls
from ...errors import ConfigError
from ..bulk import to_plain
from .options import WritePlan

__all__ = ["ChunkEncoder", "PartitionReport", "chunk_marker", "plain_column"]


def chunk_marker(keys: QueueKeys, load_id: str, partition: int, chunk: int) -> str:
    return keys.unique(f"spark:{load_id}:{partition}:{chunk}")


def _simple(arrow_type: Any) -> bool:
    import pyarrow as pa

    t = pa.types
    simple: bool = (
        t.is_integer(arrow_type)
        or t.is_floating(arrow_type)
        or t.is_string(arrow_type)
        or t.is_large_string(arrow_type)
        or t.is_boolean(arrow_type)
        or t.is_binary(arrow_type)
        or t.is_large_binary(arrow_type)
        or t.is_null(arrow_type)
    )
    return simple


def plain_column(array: Any) -> list[Any]:
    """One Arrow column as msgpack-ready Python values (see ``spark.bulk.to_plain``)."""
    if _simple(array.type):
        return cast("list[Any]", array.to_pylist())
    values = array.to_pylist(maps_as_pydicts="lossy")
    return [to_plain(v) for v in values]


def _epoch_ms(array: Any) -> list[int | None]:
    """A timestamp (or date) column as epoch ms (naive = UTC)."""
    import pyarrow as pa

    if pa.types.is_date(array.type):
        array = array.cast(pa.timestamp("ms"))
    unit = array.type.unit
    scale = {"s": 1000, "ms": 1, "us": 1 / 1000, "ns": 1 / 1_000_000}[unit]
    raw = array.cast(pa.int64()).to_pylist()
    return [None if v is None else int(v * scale) for v in raw]


@dataclass
class PartitionReport:
    """A write task's commit message: what its partition did (picklable, small)."""

    partition: int
    rows: int = 0  # rows read from Spark
    added: int = 0  # jobs written by this attempt
    skipped: int = 0  # rows a live marker suppressed (written before: a re-run, a duplicate id)
    chunks: int = 0
    attempt: int = 0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "rows": self.rows,
            "added": self.added,
            "skipped": self.skipped,
            "chunks": self.chunks,
            "attempt": self.attempt,
            **({"error": self.error} if self.error else {}),
        }


@dataclass
class ChunkEncoder:
    """Turns one partition's record batches into script calls (``calls``) for ``SyncDriver.stream``."""

    plan: WritePlan
    partition: int
    load_id: str
    sent_rows: list[int] = field(default_factory=list)  # rows per call yielded so far, in order
    before: list[int] = field(default_factory=list)  # per chunk: the timeout calls sent before it
    rows: int = 0

    def __post_init__(self) -> None:
        self.keys = QueueKeys.for_queue(self.plan.queue)
        self._names: dict[str, bytes] = {}
        self._const_name = None if self.plan.name is None else validate_job_name(self.plan.name)
        self._prefix = f"{self.load_id}-{self.partition}-"

    # ---- per record batch -----------------------------------------------------------------
    def _name_bytes(self, values: list[Any], base: int) -> list[bytes]:
        cache = self._names
        out = []
        for i, v in enumerate(values):
            b = cache.get(v) if type(v) is str else None
            if b is None:
                if not isinstance(v, str) or not v:
                    raise ConfigError(
                        f"row {base + i} of partition {self.partition}: column "
                        f"{self.plan.name_col!r} holds {v!r}; a job name must be a non-empty string"
                    )
                b = cache[v] = validate_job_name(v)
            out.append(b)
        return out

    def _data(self, batch: Any) -> list[Any]:
        plan = self.plan
        if plan.data_col is not None:
            return plain_column(batch.column(plan.data_col))
        names = list(plan.data_cols)
        if not names:
            return [{} for _ in range(batch.num_rows)]
        cols = [plain_column(batch.column(c)) for c in names]
        return [dict(zip(names, vals)) for vals in zip(*cols)]

    def _run_at(self, batch: Any, now: int) -> list[int] | None:
        plan = self.plan
        if plan.delay_ms_col is not None:
            delays = batch.column(plan.delay_ms_col).to_pylist()
            run_at = [0 if d is None or d <= 0 else now + d for d in delays]
        elif plan.run_at_col is not None:
            run_at = [0 if t is None or t <= now else t for t in _epoch_ms(batch.column(plan.run_at_col))]
        else:
            return None
        limit = plan.settings.max_delay_secs
        if limit:
            worst = max(run_at, default=0)
            if worst and (worst - now) // 1000 > limit:
                raise ConfigError(
                    f"partition {self.partition}: a row's delay of {(worst - now) // 1000} s exceeds "
                    f"max_delay_secs={limit}"
                )
        return run_at

    def _ids(self, batch: Any, base: int) -> list[str]:
        plan = self.plan
        if plan.id_col is None:
            prefix = self._prefix
            return [prefix + str(base + i) for i in range(batch.num_rows)]
        ids = batch.column(plan.id_col).to_pylist()
        out = []
        for i, v in enumerate(ids):
            s = v if type(v) is str else (None if v is None else str(v))
            if not s or len(s) > MAX_JOB_ID_CHARS or not s.strip():
                raise ConfigError(
                    f"row {base + i} of partition {self.partition}: column {plan.id_col!r} holds "
                    f"{str(v)[:50]!r}; a job id must be a non-empty string of at most "
                    f"{MAX_JOB_ID_CHARS} characters"
                )
            out.append(s)
        return out

    def encode(self, batch: Any, base: int) -> tuple[list[str], list[bytes], list[int] | None, list[bytes]]:
        """``(ids, names, run_at or None, payloads)`` of one record batch whose first row is ``base``."""
        plan = self.plan
        now = now_ms()
        n = batch.num_rows
        names = (
            [self._const_name] * n
            if self._const_name is not None
            else self._name_bytes(batch.column(plan.name_col).to_pylist(), base)
        )
        ids = self._ids(batch, base)
        datas = self._data(batch)
        run_at = self._run_at(batch, now)
        retry, limit = plan.retry, plan.settings.max_payload_bytes
        if retry is None:  # encode_new_envelope's bytes, inlined: the hot loop of the write
            pack = packb
            try:
                envelopes = [pack([jid, pack(d), now, 0]) for jid, d in zip(ids, datas)]
            except (TypeError, ValueError, OverflowError):
                envelopes = [encode_new_envelope(jid, encode_data(d), now) for jid, d in zip(ids, datas)]
        else:
            envelopes = [encode_new_envelope(jid, encode_data(d), now, retry) for jid, d in zip(ids, datas)]
        big = max(map(len, envelopes), default=0)
        if big > limit:
            i = next(i for i, e in enumerate(envelopes) if len(e) > limit)
            raise ConfigError(
                f"row {base + i} of partition {self.partition} encodes to {len(envelopes[i])} bytes; "
                f"max_payload_bytes is {limit}"
            )
        if run_at is not None:
            envelopes = [env if r == 0 else encode_member(nb, env) for env, r, nb in zip(envelopes, run_at, names)]
        return ids, names, run_at, envelopes

    def sides(self, batch: Any, base: int) -> list[tuple[int, str]]:
        """Each row's ``(priority or 0, group or "")`` (``priority_col`` / ``group_col``)."""
        plan, n = self.plan, batch.num_rows
        priorities = [None] * n if plan.priority_col is None else batch.column(plan.priority_col).to_pylist()
        groups = [None] * n if plan.group_col is None else batch.column(plan.group_col).to_pylist()
        out = []
        for i, (p, g) in enumerate(zip(priorities, groups)):
            try:
                if p is not None and g is not None:
                    raise ConfigError("a job takes a priority or a group, not both")
                out.append((0 if p is None else check_priority(p), "" if g is None else check_group(g)))
            except ConfigError as exc:
                raise ConfigError(f"row {base + i} of partition {self.partition}: {exc}") from None
        return out

    # ---- the partition's calls --------------------------------------------------------------
    def _call(
        self,
        chunk: int,
        ids: list[str],
        names: list[bytes],
        run_at: list[int],
        payloads: list[bytes],
        sides: list[tuple[int, str]],
    ) -> Call:
        plan, k = self.plan, self.keys
        head = (plan.dedup_ttl_ms, plan.settings.max_stream_len)
        if plan.side:  # rows.EnqueueSideRow per job (no delays here: write_plan refuses them)
            argv = (*head, k.prefix) + tuple(
                chain.from_iterable((p, g, e, nb) for (p, g), e, nb in zip(sides, payloads, names))
            )
            marker = chunk_marker(k, self.load_id, self.partition, chunk)
            keys = (k.stream, k.controls, k.prioritized, k.groups, marker)
            return script_call("enqueue_batch_side_once", keys, argv)
        if plan.id_col is None:
            argv = head + tuple(chain.from_iterable(zip(run_at, payloads, names)))  # rows.EnqueueOnceRow per job
            marker = chunk_marker(k, self.load_id, self.partition, chunk)
            return script_call("enqueue_batch_once", (k.stream, k.delayed, marker), argv)
        argv = head + tuple(chain.from_iterable(zip(ids, run_at, payloads, names)))  # rows.EnqueueUniqueRow per job
        return script_call("enqueue_batch_unique", (k.stream, k.delayed, *map(k.unique, ids)), argv)

    def calls(self, batches: Iterable[Any]) -> Iterator[Call]:
        """One call per ``chunk_size`` rows, counted from the partition's first row."""
        size = self.plan.chunk_size
        ids: list[str] = []
        names: list[bytes] = []
        run_at: list[int] = []
        payloads: list[bytes] = []
        sides: list[tuple[int, str]] = []
        chunk = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if self.plan.side:
                sides += self.sides(batch, self.rows)
            b_ids, b_names, b_run, b_payloads = self.encode(batch, self.rows)
            self.rows += batch.num_rows
            ids += b_ids
            names += b_names
            run_at += b_run if b_run is not None else [0] * len(b_ids)
            payloads += b_payloads
            while len(ids) >= size:
                yield from self._timeouts(ids[:size], run_at[:size])
                yield self._call(chunk, ids[:size], names[:size], run_at[:size], payloads[:size], sides[:size])
                self.sent_rows.append(size)
                chunk += 1
                del ids[:size], names[:size], run_at[:size], payloads[:size], sides[:size]
        if ids:
            yield from self._timeouts(ids, run_at)
            yield self._call(chunk, ids, names, run_at, payloads, sides)
            self.sent_rows.append(len(ids))

    def _timeouts(self, ids: list[str], run_at: list[int]) -> list[Call]:
        """With ``timeout_ms``: each job's own timeout, kept just before its chunk is written (a
        chunk the script then skips leaves keys that expire); counted in ``before``."""
        ms = self.plan.timeout_ms
        if not ms:
            self.before.append(0)
            return []
        now = now_ms()
        calls = timeout_calls(self.keys, [(jid, ms, max(0, r - now) if r else 0) for jid, r in zip(ids, run_at)])
        self.before.append(len(calls))
        return calls


def settle(report: PartitionReport, encoder: ChunkEncoder, replies: list[Any], id_mode: bool) -> PartitionReport:
    """Fold the scripts' replies (jobs added, or -1 for a chunk written before) into the report."""
    pos = 0
    for rows, before in zip(encoder.sent_rows, encoder.before):
        pos += before  # the timeout keys written before the chunk
        n = int(replies[pos])
        pos += 1
        if n < 0:
            report.skipped += rows
        else:
            report.added += n
            report.skipped += rows - n if id_mode else 0
    report.rows = encoder.rows
    report.chunks = len(encoder.sent_rows)
    return report
