"""The dead-letter queue's tools as flows (``Queue.peek_dlq``, ``replay_dlq``, ``remove_dlq``,
``purge_dlq`` and their twins, ``chasqui dlq``; the dashboard's filtered pages and replays,
``dlq_page``, ``replay_ids``, ``replay_matching``): a page of entries at a time, never the
whole stream in one reply.  A replay moves entries back to the stream with ``attempt`` reset
inside one script (``lua/replay_dlq.lua``), so a concurrent replay never moves an entry twice;
undecodable entries stay where they are and are counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..errors import CodecError, ConfigError
from .calls import Call, Flow, command, int_reply, reply_pairs, script_call, str_reply
from .codec import decode_envelope, encode_envelope, items_list, utf8_text
from .event_follow import after, is_stream_id
from .failure import failure_record
from .keys import QueueKeys
from .scan import ENVELOPE_ID_PREFIX, ends_call, envelope_id, parse_ends, parse_scan, scan_call
from .settings import I64_MAX, QueueSettings

__all__ = ["DlqFlows", "DLQ_PAGE", "check_dlq_ids", "positive", "dlq_page", "dlq_row", "replay_ids", "replay_matching"]

#: Entries read (or deleted) per round trip by the DLQ tools.
DLQ_PAGE = 500
PAGE_WINDOW = 200  # DLQ summaries read per scan while filling a filtered page
MAX_WINDOWS = 10  # scans one filtered page may read before it hands back a cursor
REPLAY_BATCH = 16  # DLQ entries read whole per round trip when replaying by id
REPLAY_BYTES = 8 * 1024 * 1024  # field bytes a replay reads per round trip (and one entry past it)
# DLQ reasons of a handler that raised: our workers put its traceback in the entry's `detail`.
_HANDLER_REASONS = frozenset({"retries_exhausted", "unrecoverable"})


def positive(value: Any, what: str) -> None:
    """A ``ConfigError`` naming ``what`` unless ``value`` is a positive int (bool is not) that
    Redis takes as a count (a signed 64-bit one: 2**64 came back as Redis' "out of range")."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= I64_MAX:
        raise ConfigError(f"{what} must be a positive int up to 2**63 - 1, got {value!r}")


def check_dlq_ids(ids: list[Any], what: str = "DLQ ids") -> list[str]:
    """``ids`` if each is a whole stream id (``<ms>-<seq>``, each part a u64), else a
    ``ConfigError`` naming them: Redis would refuse the call with a bare "Invalid stream ID"."""
    bad = [i for i in ids if not isinstance(i, str) or "-" not in i or not is_stream_id(i)]
    if bad:
        raise ConfigError(f"{what} look like 1700000000000-0; got {bad[:5]!r}")
    return ids


class DlqFlows:
    """``ProducerCore``'s DLQ methods (a mixin: it needs the queue's ``keys`` and ``settings``)."""

    keys: QueueKeys
    settings: QueueSettings

    def peek_dlq(self, limit: int = 20) -> Flow[list[dict[str, Any]]]:
        positive(limit, "limit")
        rows = yield command("XRANGE", self.keys.dlq, "-", "+", "COUNT", limit)
        out: list[dict[str, Any]] = []
        for entry_id, flat in rows or []:
            f = reply_pairs(flat or [])
            payload = bytes(f.get("d", b""))
            try:
                job_id: str | None = decode_envelope(payload).id
            except CodecError:  # an undecodable entry has no job id to show
                job_id = None
            out.append(
                {
                    "dlq_id": str_reply(entry_id),
                    "job_id": job_id,
                    "source_id": str_reply(f.get("source_id", b"")),
                    "reason": str_reply(f.get("reason", b"")),
                    "detail": str_reply(f["detail"]) if "detail" in f else None,
                    "error": None,
                    "traceback": None,
                    "payload": payload,
                    "name": str_reply(f.get("n", b"")),
                }
            )
        # The handler's error lives in the job's failure record (written by workers that store
        # results, as `chasqui worker` does by default): a failed task is matched to its row.
        known = [r for r in out if r["job_id"]]
        if known:
            records = yield [command("GET", self.keys.failure(r["job_id"])) for r in known]
            for row, raw in zip(known, records):
                record = failure_record(str(row["job_id"]), raw)
                if record is not None:
                    row["error"], row["traceback"] = record.error, record.traceback
        for row in out:  # without a record: a handler failure's `detail` is its traceback (our workers)
            if row["traceback"] is None and row["reason"] in _HANDLER_REASONS and row["detail"]:
                row["traceback"] = row["detail"]
        return out

    def replay_dlq(self, limit: int = 100) -> Flow[int]:
        """Reset ``attempt`` to 0 and move up to ``limit`` entries back; the number moved."""
        report = yield from self.replay_dlq_report(limit)
        return report["replayed"]

    def replay_dlq_report(self, limit: int = 100) -> Flow[dict[str, int]]:
        """``replay_dlq`` that pages past undecodable entries: ``{"replayed": n, "skipped": k}``.

        Entries are read oldest first, a page at a time, until ``limit`` were replayed or the
        DLQ ends; entries whose payload does not decode stay in the DLQ (as ChasquiMQ) and are
        counted in ``skipped``, so a head of corrupt entries no longer hides the good ones
        behind it.  The name is replayed byte for byte.
        """
        positive(limit, "limit")
        k = self.keys
        replayed = skipped = 0
        start = "-"
        while replayed < limit:
            count = min(DLQ_PAGE, limit - replayed)
            # whole entries, but at most REPLAY_BYTES of them a round trip (1 MiB payloads would
            # otherwise make a page of 500 a half-gigabyte reply)
            read = scan_call(
                k.dlq, start, "+", count=count, whole_d=True, step=64, max_bytes=REPLAY_BYTES, max_matches=count
            )
            window = parse_scan((yield read))
            rows = [(e, f) for e, f, _size in window.matches]
            argv, bad = _replay_argv(rows, self.settings.max_stream_len)
            skipped += bad
            if len(argv) > 1:  # fewer moved than sent when a concurrent replay moved some first
                replayed += int_reply((yield script_call("replay_dlq", (k.dlq, k.stream), argv)))
            nxt = after(window.last) if window.last and not window.done else None
            if nxt is None:
                break
            start = nxt
        return {"replayed": replayed, "skipped": skipped}

    def remove_dlq(self, dlq_ids: Iterable[str]) -> Flow[int]:
        """Delete DLQ entries by id; the number that existed."""
        ids = check_dlq_ids([dlq_ids] if isinstance(dlq_ids, str) else items_list(dlq_ids, "dlq_ids"))
        if not ids:
            return 0
        removed = 0
        for i in range(0, len(ids), DLQ_PAGE):
            removed += int_reply((yield command("XDEL", self.keys.dlq, *ids[i : i + DLQ_PAGE])))
        return removed

    def purge_dlq(self, *, reason: str | None = None, name: str | None = None) -> Flow[int]:
        """Delete every DLQ entry there now (entries dead-lettered meanwhile stay), or only
        those with this ``reason`` and/or job ``name``; the number deleted."""
        for what, value in (("reason", reason), ("name", name)):
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{what} must be a str, got {value!r}")
            if value is not None:
                utf8_text(value, what)
        k = self.keys
        ends = parse_ends((yield ends_call(k.dlq)))
        if ends is None:
            return 0
        last_id = ends[1]
        if reason is None and name is None:  # everything below the last entry, then the last:
            # no "next id" to compute (the last may end in the largest sequence), and an entry
            # dead-lettered meanwhile has a larger id than both
            trimmed, deleted = yield [command("XTRIM", k.dlq, "MINID", last_id), command("XDEL", k.dlq, last_id)]
            return int_reply(trimmed) + int_reply(deleted)
        removed, start = 0, "-"
        while True:  # matched on summaries (payloads cut to their id), deleted by id
            window = parse_scan((yield _scan(k, start, last_id, reason, name)))
            doomed = [
                e
                for e, f, _size in window.matches
                if _matches(str_reply(f.get("reason", b"")), str_reply(f.get("n", b"")), reason, name)
            ]
            if doomed:
                removed += int_reply((yield command("XDEL", k.dlq, *doomed)))
            nxt = after(window.last) if window.last and not window.done else None
            if nxt is None:
                return removed
            start = nxt


def _matches(entry_reason: str, entry_name: str, reason: str | None, name: str | None) -> bool:
    """Whether an entry passes the ``reason`` and ``name`` filters (None: any)."""
    return (reason is None or entry_reason == reason) and (name is None or entry_name == name)


def _replay_argv(rows: list[tuple[Any, dict[str, Any]]], max_len: int) -> tuple[list[Any], int]:
    """``replay_dlq.lua``'s argv for these whole DLQ entries (``(id, fields)``: id, the
    envelope with ``attempt`` reset to 0, the name byte for byte), and how many were skipped
    because their payload does not decode (they stay in the DLQ, as ChasquiMQ leaves them)."""
    argv: list[Any] = [max_len]
    skipped = 0
    for entry_id, f in rows:
        try:
            env = decode_envelope(bytes(f.get("d", b"")))
        except Exception:  # noqa: BLE001 - malformed entries stay in the DLQ by design
            skipped += 1
            continue
        argv += (entry_id, encode_envelope(env.with_attempt(0)), bytes(f.get("n", b"")))
    return argv, skipped


def dlq_row(entry_id: str, f: dict[str, bytes], size: int) -> dict[str, Any]:
    """One row of a filtered page from a scan match: fields cut to ``ENVELOPE_ID_PREFIX``
    bytes (the job id is read from the envelope's first bytes), ``size`` the whole payload's."""
    return {
        "dlq_id": entry_id,
        "job_id": envelope_id(f.get("d", b"")),
        "name": str_reply(f.get("n", b"")),
        "reason": str_reply(f.get("reason", b"")),
        "detail": str_reply(f["detail"]) if "detail" in f else None,
        "bytes": max(size, 0),
        "source_id": str_reply(f.get("source_id", b"")),
    }


def _scan(k: QueueKeys, start: str, end: str = "+", reason: str | None = None, name: str | None = None) -> Call:
    """Summaries of up to ``PAGE_WINDOW`` entries from ``start``: every field cut to
    ``ENVELOPE_ID_PREFIX`` bytes, or longer when a filter is longer, so a cut field is always
    longer than the filter and a match stays exact (a UTF-8 decode never shortens bytes)."""
    longest = max((len(f) for f in (reason, name) if f is not None), default=0)
    clip = max(ENVELOPE_ID_PREFIX, 4 * longest + 1)
    return scan_call(k.dlq, start, end, count=PAGE_WINDOW, clip=clip, max_matches=PAGE_WINDOW, step=PAGE_WINDOW)


def dlq_page(queue: str, cursor: str | None, count: int, reason: str | None, name: str | None) -> Flow[dict[str, Any]]:
    """One page of DLQ entries oldest first, filtered by reason and/or name: at most
    ``MAX_WINDOWS`` scans of ``PAGE_WINDOW`` entries per page; ``next`` continues.  Each row
    with a job id carries the handler's ``error`` from its failure record (None without one)."""
    k = QueueKeys.for_queue(queue)
    if cursor:
        check_dlq_ids([cursor], "a DLQ page cursor must")
    start = after(cursor) if cursor else "-"
    rows: list[dict[str, Any]] = []
    nxt: str | None = None
    total = yield command("XLEN", k.dlq)
    if start is None:  # a cursor at the largest id: nothing follows
        return {"rows": rows, "next": None, "total": int_reply(total)}
    for _ in range(MAX_WINDOWS):
        window = parse_scan((yield _scan(k, start, "+", reason, name)))
        for entry_id, fields, size in window.matches:
            row = dlq_row(entry_id, fields, size)
            nxt = row["dlq_id"]
            if _matches(row["reason"], row["name"], reason, name):
                rows.append(row)
                if len(rows) == count:
                    break
        following = after(nxt) if nxt is not None else None
        if len(rows) == count or window.done or following is None:
            break
        start = following
    following = after(nxt) if nxt is not None else None
    more = bool((yield command("XRANGE", k.dlq, following, "+", "COUNT", 1))) if following is not None else False
    known = [r for r in rows if r["job_id"]]
    if known:
        records = yield [command("GET", k.failure(r["job_id"])) for r in known]
        for row, raw in zip(known, records):
            record = failure_record(row["job_id"], raw)
            row["error"] = record.error if record is not None else None
    return {"rows": rows, "next": nxt if more else None, "total": int_reply(total)}


def replay_ids(queue: str, ids: list[str], max_len: int) -> Flow[tuple[int, int]]:
    """Replay these DLQ entries, read whole ``REPLAY_BATCH`` at a time (a round trip carries at
    most that many payloads): ``(replayed, undecodable skipped)``; an entry another replay
    moved first is not counted twice."""
    check_dlq_ids(ids)
    k = QueueKeys.for_queue(queue)
    replayed = skipped = 0
    for at in range(0, len(ids), REPLAY_BATCH):
        replies = yield [command("XRANGE", k.dlq, i, i) for i in ids[at : at + REPLAY_BATCH]]
        argv, bad = _replay_argv([(r[0][0], reply_pairs(r[0][1] or [])) for r in replies if r], max_len)
        skipped += bad
        if len(argv) > 1:
            replayed += int_reply((yield script_call("replay_dlq", (k.dlq, k.stream), argv)))
    return replayed, skipped


def replay_matching(queue: str, reason: str | None, name: str | None, max_len: int) -> Flow[dict[str, int]]:
    """Replay every entry there now with this reason and/or name, a scan window at a time
    (matching is decided on summaries; only chosen entries are read whole)."""
    k = QueueKeys.for_queue(queue)
    ends = parse_ends((yield ends_call(k.dlq)))
    if ends is None:
        return {"replayed": 0, "skipped": 0}
    last_id = ends[1]
    replayed = skipped = 0
    start = "-"
    while True:
        window = parse_scan((yield _scan(k, start, last_id, reason, name)))
        chosen = [
            e
            for e, f, _size in window.matches
            if _matches(str_reply(f.get("reason", b"")), str_reply(f.get("n", b"")), reason, name)
        ]
        done, bad = yield from replay_ids(queue, chosen, max_len)
        replayed, skipped = replayed + done, skipped + bad
        nxt = after(window.last) if window.last and not window.done else None
        if nxt is None:
            return {"replayed": replayed, "skipped": skipped}
        start = nxt
