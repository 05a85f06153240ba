"""What the dashboard reads and changes, on the engine's blocking API (``SyncQueue``) and the
core's read flows (``core/inspect.py``, ``core/job_details.py``, ``core/dlq.py``: the same
reads the CLI makes) wherever they have the call, and bounded reads everywhere.

No KEYS and no whole-stream reads per page view: queues are found by a cursor SCAN in a
background thread (its result cached), events and DLQ pages are XRANGE/XREVRANGE windows
with a COUNT, spec listings are ZSCAN pages.  Nothing here imports FastAPI or Airflow.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from redis.cluster import RedisCluster

from ..core.calls import Flow, command, int_reply, reply_pairs, str_reply
from ..core.codec import decode_data, decode_envelope, now_ms
from ..core.dlq import check_dlq_ids, dlq_page, dlq_row, replay_ids, replay_matching
from ..core.history import Series, history_flow
from ..core.inspect import QueueSnapshot, snapshot
from ..core.job_details import JobDetails, job_details, latest_attempt
from ..core.keys import DEFAULT_GROUP, QueueKeys, validate_queue_name
from ..core.liveness import read_workers
from ..core.origin import Origin, parse_origin
from ..core.schedules import SpecFlows
from ..core.spec_reads import spec_row
from ..core.urls import WAIT_BLOCK_MS, read_timeout, redact_url
from ..errors import CodecError, ConfigError, JobNotFound
from ..sync import SyncDriver
from ..sync.queue import SyncQueue

_R = TypeVar("_R")

__all__ = ["Source", "SourceSet", "StaticSources", "pretty", "audit"]

log = logging.getLogger(__name__)
audit_log = logging.getLogger("airflow_provider_chasqui.dashboard.audit")

EVENT_WINDOW = 2000  # newest events read for the per-minute rates of one queue's page, and per job lookup
OVERVIEW_EVENT_WINDOW = 1000  # and per queue on the Queues page (up to 50 queues a page)
RATE_MINUTES = 10
DATA_CAP = 64 * 1024  # characters of a payload shown
SCAN_COUNT = 5000
QUEUE_CACHE = 256  # queue objects a Source keeps (see Source.queue)
SCAN_REFRESH_S = 30.0


def audit(user: str, source: str, queue: str, action: str, **details: Any) -> None:
    """One line per change made from the dashboard: who, where, what, and the outcome."""
    extra = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in details.items())
    audit_log.info(
        "chasqui dashboard audit: user=%s source=%s queue=%s action=%s %s",
        json.dumps(user),
        json.dumps(source),
        json.dumps(queue),
        action,
        extra,
    )


def pretty(value: Any, cap: int = DATA_CAP) -> tuple[str, bool]:
    """JSON-ish text of a decoded payload, and whether it was cut at ``cap`` characters."""
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, default=repr, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    return (text[:cap], True) if len(text) > cap else (text, False)


def _id_ms(entry_id: str) -> int:
    return int(entry_id.partition("-")[0] or 0)


def _decode_payload(raw: bytes) -> dict[str, Any]:
    """Job id, attempt, creation time and payload text of an envelope; ``error`` when it does not decode."""
    try:
        env = decode_envelope(raw)
    except CodecError as exc:
        return {"job_id": None, "error": str(exc), "size": len(raw)}
    out: dict[str, Any] = {
        "job_id": env.id,
        "attempt": env.attempt,
        "created_ms": env.created_at_ms,
        "size": len(env.inner),
        "error": None,
    }
    try:
        out["data"], out["truncated"] = pretty(decode_data(env.inner))
    except Exception as exc:  # noqa: BLE001 - a payload this codec cannot read is shown, not raised
        out["data"], out["truncated"] = f"(undecodable payload: {exc})", False
    return out


@dataclass
class QueueRow:
    """One row of the Queues page: the queue's snapshot (``core.inspect``, what ``chasqui
    inspect`` and the metrics read too) and the page's own addition, the per-minute rates."""

    queue: str
    snap: QueueSnapshot
    completed: list[int]  # per minute, oldest first (RATE_MINUTES buckets)
    failed: list[int]
    events_window_full: bool
    start_ms: int = 0  # when the first bucket begins

    @property
    def waiting(self) -> int | None:
        return self.snap.waiting

    @property
    def oldest_waiting_age_ms(self) -> int | None:
        return self.snap.oldest_waiting_ms

    def to_dict(self) -> dict[str, Any]:
        d = self.snap.to_dict()
        d.update(
            oldest_waiting_age_ms=self.snap.oldest_waiting_ms,
            completed_per_min=self.completed,
            failed_per_min=self.failed,
            events_window_full=self.events_window_full,
        )
        return d


def queue_flow(queue: str, group: str, now: int, event_window: int = EVENT_WINDOW) -> Flow[QueueRow]:
    """The snapshot plus the completed/failed counts per minute over the newest
    ``event_window`` events of the last ``RATE_MINUTES`` minutes (a bounded read)."""
    k = QueueKeys.for_queue(queue)
    snap: QueueSnapshot = yield from snapshot(queue, group=group, now_ms=now)
    since = now - RATE_MINUTES * 60_000
    events = (
        []
        if k.events in snap.spoiled  # another type (hostile): no rates, the page says why
        else (yield command("XREVRANGE", k.events, "+", f"{since}-0", "COUNT", event_window))
    )
    completed = [0] * RATE_MINUTES
    failed = [0] * RATE_MINUTES
    for entry_id, flat in events or []:
        age_min = (now - _id_ms(str_reply(entry_id))) // 60_000
        if not 0 <= age_min < RATE_MINUTES:
            continue
        kind = flat[1] if flat and flat[0] == b"e" else reply_pairs(flat).get("e", b"")  # e is written first
        bucket = RATE_MINUTES - 1 - age_min
        if kind == b"completed":
            completed[bucket] += 1
        elif kind in (b"failed", b"dlq"):
            failed[bucket] += 1
    return QueueRow(queue, snap, completed, failed, len(events or []) >= event_window, since)


class Source:
    """One Redis server (a URL, or an Airflow connection): a driver shared by its queues,
    and the cached list of the queues found there."""

    def __init__(self, label: str, url: str, *, queues: Iterable[str] = (), group: str = DEFAULT_GROUP) -> None:
        self.label = label
        self.url = url
        self.group = group
        self.driver = SyncDriver(url, socket_timeout=read_timeout(WAIT_BLOCK_MS))
        self._fixed = sorted({validate_queue_name(q) for q in queues})
        # queue objects by name, newest use last: any name typed into a URL makes one, so at most
        # QUEUE_CACHE are kept (they share the driver; an evicted one is only made again)
        self._queues: collections.OrderedDict[str, SyncQueue] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._found: set[str] = set()
        self._scanned_at: float | None = None
        self._scanning: threading.Thread | None = None
        self._scan_error: str | None = None
        self._closed = False

    @property
    def shown_url(self) -> str:
        return redact_url(self.url)

    def queue(self, name: str) -> SyncQueue:
        validate_queue_name(name)
        with self._lock:
            q = self._queues.get(name)
            if q is None:
                q = self._queues[name] = SyncQueue(name, redis_url=self.url, driver=self.driver)
                while len(self._queues) > QUEUE_CACHE:
                    self._queues.popitem(last=False)
            else:
                self._queues.move_to_end(name)
            return q

    def run(self, flow: Flow[_R]) -> _R:
        return self.driver.run(flow)

    # ---- queue discovery -----------------------------------------------------------------
    def queue_names(self, wait_s: float = 0.15) -> tuple[list[str], dict[str, Any]]:
        """Known queue names and the state of the scan that finds them.  A scan starts in the
        background when none ran within ``SCAN_REFRESH_S``; the caller waits at most
        ``wait_s`` for it and otherwise shows what is known so far."""
        thread = None
        with self._lock:
            stale = self._scanned_at is None or time.monotonic() - self._scanned_at > SCAN_REFRESH_S
            if stale and self._scanning is None and not self._closed:
                thread = self._scanning = threading.Thread(
                    target=self._scan, name=f"chasqui-scan-{self.label}", daemon=True
                )
                thread.start()
            running = self._scanning
        if running is not None and wait_s > 0 and self._scanned_at is None:  # only the first scan is waited for
            running.join(wait_s)
        with self._lock:
            names = sorted(self._found | set(self._fixed))
            state = {"scanning": self._scanning is not None, "scanned_at": self._scanned_at, "error": self._scan_error}
        return names, state

    def _nodes(self) -> list[dict[str, Any]]:
        client = self.driver.client
        if isinstance(client, RedisCluster):
            return [{"target_nodes": n} for n in client.get_primaries()]
        return [{}]

    def _scan(self) -> None:
        found: set[str] = set()
        try:
            client = self.driver.client
            for kind in ("stream", "zset"):  # every queue has a stream or a ZSET (delayed, repeat)
                for kw in self._nodes():
                    cursor = b"0"
                    while True:
                        cursor, keys = client.execute_command(
                            "SCAN", cursor, "MATCH", "{chasqui:*", "COUNT", SCAN_COUNT, "TYPE", kind, **kw
                        )
                        for raw in keys:
                            text = bytes(raw).decode("utf-8", "replace")
                            name = text[len("{chasqui:") : text.find("}")] if "}" in text else ""
                            if name and name not in found:
                                try:
                                    validate_queue_name(name)
                                except ConfigError:
                                    continue
                                found.add(name)
                                with self._lock:
                                    self._found.add(name)
                        if cursor in (b"0", 0, "0"):
                            break
            with self._lock:
                self._found = found
                self._scanned_at = time.monotonic()
                self._scan_error = None
        except Exception as exc:  # noqa: BLE001 - shown on the page; the next view retries
            log.warning("chasqui dashboard: scanning %s failed: %s", self.shown_url, exc)
            with self._lock:
                self._scan_error = str(exc)
                self._scanned_at = time.monotonic()
        finally:
            with self._lock:
                self._scanning = None

    # ---- pages -----------------------------------------------------------------------------
    def queue_row(self, queue: str, group: str | None = None, event_window: int = EVENT_WINDOW) -> QueueRow:
        return self.run(queue_flow(queue, group or self.group, now_ms(), event_window))

    def history(self, queue: str, span_ms: int, step_ms: int) -> Series:
        """Completed and failed runs per ``step_ms`` over the last ``span_ms`` (``core/history.py``)."""
        return self.run(history_flow(queue, now_ms(), span_ms, step_ms))

    def job(self, queue: str, job_id: str) -> JobDetails | None:
        """The job as ``chasqui job show`` sees it (``core.job_details.job_details``), None if no trace."""
        try:
            return self.run(job_details(queue, job_id, group=self.group))
        except JobNotFound:
            return None

    def dlq_page(
        self, queue: str, cursor: str | None, count: int, reason: str | None, name: str | None
    ) -> dict[str, Any]:
        return self.run(dlq_page(queue, cursor, count, reason, name))

    def dlq_entry(self, queue: str, dlq_id: str) -> dict[str, Any] | None:
        return self.run(dlq_entry_flow(queue, dlq_id))

    def replay_ids(self, queue: str, ids: list[str]) -> int:
        replayed, _skipped = self.run(replay_ids(queue, ids, self.queue(queue)._flows.settings.max_stream_len))
        return replayed

    def replay_matching(self, queue: str, reason: str | None, name: str | None) -> dict[str, int]:
        if reason is None and name is None:
            q = self.queue(queue)
            total = int_reply(self.run(_one(command("XLEN", q.keys.dlq))))
            return q.replay_dlq_report(max(1, total))
        return self.run(replay_matching(queue, reason, name, self.queue(queue)._flows.settings.max_stream_len))

    def spec_search(self, queue: str, prefix: str, cursor: str | None, count: int) -> tuple[list[Any], str | None]:
        return self.run(spec_prefix_flow(queue, prefix, cursor, count))

    def spec_origins(self, queue: str, spec_keys: list[str]) -> dict[str, Origin | None]:
        """The task that last upserted each spec (one MGET of a page's keys; ``core/origin.py``)."""
        if not spec_keys:
            return {}
        k = QueueKeys.for_queue(queue)
        raw = self.run(_one(command("MGET", *[k.spec_origin(key) for key in spec_keys])))
        return {key: parse_origin(r) for key, r in zip(spec_keys, raw or [])}

    def quarantined(self, queue: str, limit: int = 50) -> list[tuple[str, int]]:
        k = QueueKeys.for_queue(queue)
        _cur, flat = self.run(_one(command("HSCAN", k.repeat_quarantine, 0, "COUNT", limit)))
        return [(str_reply(flat[i]), len(flat[i + 1])) for i in range(0, len(flat or []), 2)][:limit]

    def workers(self, queue: str) -> dict[str, Any]:
        return self.run(workers_flow(queue, now_ms()))

    def close(self) -> None:
        self._closed = True
        self.driver.close()


def _one(call: Any) -> Flow[Any]:
    reply = yield call
    return reply


def dlq_entry_flow(queue: str, dlq_id: str) -> Flow[dict[str, Any] | None]:
    check_dlq_ids([dlq_id], "a DLQ entry id must")
    k = QueueKeys.for_queue(queue)
    rows = yield command("XRANGE", k.dlq, dlq_id, dlq_id)
    if not rows:
        return None
    entry_id, flat = rows[0]
    f = {key: bytes(v) for key, v in reply_pairs(flat).items()}
    row = dlq_row(str_reply(entry_id), f, len(f.get("d", b"")))
    row["payload"] = p = _decode_payload(f.get("d", b""))
    if isinstance(p.get("attempt"), int):  # the job page's numbering (core.job_details.latest_attempt)
        p["attempt"] = latest_attempt(p["attempt"], "failed", row.get("reason"))
    return row


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def spec_prefix_flow(queue: str, prefix: str, cursor: str | None, count: int) -> Flow[tuple[list[Any], str | None]]:
    """Specs whose key starts with ``prefix``: ZSCAN ... MATCH over the active then the paused
    specs, at most 20 ZSCAN calls per page, then their hashes in two pipelined round trips
    (the listing's own reader, so corrupt specs show as such); ``(items, next cursor or None)``."""
    k = QueueKeys.for_queue(queue)
    specs = SpecFlows(queue)
    phase, _, pos = (cursor or "r:0").partition(":")
    if phase not in ("r", "p") or not pos.isdigit():
        raise ConfigError(f"bad cursor {cursor!r}")
    position = int(pos)
    found: list[tuple[bytes, Any, bool]] = []
    pattern = _glob_escape(prefix) + "*"
    nxt: str | None = None
    for _ in range(20):
        zset = k.repeat if phase == "r" else k.repeat_paused
        reply_pos, flat = yield command("ZSCAN", zset, position, "MATCH", pattern, "COUNT", 1000)
        found += [(bytes(flat[i]), flat[i + 1], phase == "p") for i in range(0, len(flat or []), 2)]
        position = int_reply(reply_pos)
        if position == 0:
            if phase == "p":
                break
            phase = "p"
        if len(found) >= count:
            nxt = f"{phase}:{position}"
            break
    else:
        nxt = f"{phase}:{position}"
    items: list[Any] = []
    if found:
        rows = yield from specs._read_hashes([rk for rk, _s, _p in found])  # same package
        for (raw_key, score, paused), fields in zip(found, rows):
            items.extend(spec_row(raw_key, score, paused, fields, specs._info))
    return items, nxt


def workers_flow(queue: str, now: int) -> Flow[dict[str, Any]]:
    """Every group of the stream with its consumers (idle, pending, alive by their heartbeat),
    the workers that beat (``core/liveness.py``), and the lock holders."""
    k = QueueKeys.for_queue(queue)
    exists, promoter, scheduler, p_ttl, s_ttl = yield [
        command("EXISTS", k.stream),
        command("GET", k.promoter_lock),
        command("GET", k.scheduler_lock),
        command("PTTL", k.promoter_lock),
        command("PTTL", k.scheduler_lock),
    ]
    groups: list[dict[str, Any]] = []
    if int_reply(exists):
        for g in (yield command("XINFO", "GROUPS", k.stream)) or []:
            info = reply_pairs(g)
            groups.append(
                {
                    "name": str_reply(info.get("name", b"")),
                    "pending": int_reply(info.get("pending", 0)),
                    "lag": None if info.get("lag") is None else int_reply(info["lag"]),
                    "consumers": [],
                }
            )
        for g in groups[:20]:
            for row in (yield command("XINFO", "CONSUMERS", k.stream, g["name"])) or []:
                info = reply_pairs(row)
                g["consumers"].append(
                    {
                        "name": str_reply(info.get("name", b"")),
                        "pending": int_reply(info.get("pending", 0)),
                        "idle_ms": int_reply(info.get("idle", 0)),
                        "inactive_ms": None if info.get("inactive") is None else int_reply(info["inactive"]),
                    }
                )
    workers = yield from read_workers(k, now)
    live = {w.consumer: w.live for w in workers}
    for g in groups:
        for c in g["consumers"]:
            c["live"] = live.get(c["name"])
    return {
        "queue": queue,
        "workers": [w.to_dict() for w in workers],
        "groups": groups,
        "promoter": {"holder": str_reply(promoter) if promoter else None, "ttl_ms": int_reply(p_ttl)},
        "scheduler": {"holder": str_reply(scheduler) if scheduler else None, "ttl_ms": int_reply(s_ttl)},
    }


# ---- the set of servers one dashboard shows ---------------------------------------------------
class SourceSet:
    """The servers a dashboard can show, by label (standalone: one; in Airflow: every
    ``chasqui`` connection)."""

    def labels(self) -> list[str]:
        raise NotImplementedError

    def get(self, label: str | None) -> Source:
        raise NotImplementedError

    def close(self) -> None:
        pass


class StaticSources(SourceSet):
    def __init__(self, urls: Mapping[str, str], *, queues: Iterable[str] = (), group: str = DEFAULT_GROUP) -> None:
        if not urls:
            raise ConfigError("the dashboard needs at least one Redis URL")
        self._sources = {label: Source(label, url, queues=queues, group=group) for label, url in urls.items()}

    def labels(self) -> list[str]:
        return list(self._sources)

    def get(self, label: str | None) -> Source:
        if label is None or label == "":
            return next(iter(self._sources.values()))
        try:
            return self._sources[label]
        except KeyError:
            raise ConfigError(f"no Redis source named {label!r}") from None

    def close(self) -> None:
        for s in self._sources.values():
            s.close()
