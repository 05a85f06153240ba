"""The dead-letter queue's tools as flows (``Queue.peek_dlq``, ``replay_dlq``, ``remove_dlq``,
``purge_dlq`` and their twins, ``chasqui dlq``): a page of entries at a time, never the whole
stream in one reply.  A replay moves entries back to the stream with ``attempt`` reset inside
one script (``lua/replay_dlq.lua``), so a concurrent replay never moves an entry twice;
undecodable entries stay where they are and are counted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..errors import CodecError, ConfigError
from .calls import Flow, command, int_reply, reply_pairs, script_call, str_reply
from .codec import decode_envelope, encode_envelope
from .event_follow import stream_id
from .failure import failure_record
from .keys import QueueKeys
from .settings import QueueSettings

__all__ = ["DlqFlows", "DLQ_PAGE", "positive"]

#: Entries read (or deleted) per round trip by the DLQ tools.
DLQ_PAGE = 500
_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")
# DLQ reasons of a handler that raised: our workers put its traceback in the entry's `detail`.
_HANDLER_REASONS = frozenset({"retries_exhausted", "unrecoverable"})


def positive(value: Any, what: str) -> None:
    """A ``ConfigError`` naming ``what`` unless ``value`` is a positive int (bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")


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
            rows = (yield command("XRANGE", k.dlq, start, "+", "COUNT", DLQ_PAGE)) or []
            argv: list[Any] = [self.settings.max_stream_len]
            taken, full = 0, False
            for entry_id, flat in rows:
                if taken == limit - replayed:
                    full = True
                    break
                start = "(" + str_reply(entry_id)
                f = reply_pairs(flat or [])
                try:
                    env = decode_envelope(bytes(f.get("d", b"")))
                except Exception:  # noqa: BLE001 - malformed entries stay in the DLQ by design
                    skipped += 1
                    continue
                argv += (entry_id, encode_envelope(env.with_attempt(0)), bytes(f.get("n", b"")))  # a rows.ReplayRow
                taken += 1
            if taken:  # fewer than taken when a concurrent replay moved some first
                replayed += int_reply((yield script_call("replay_dlq", (k.dlq, k.stream), argv)))
            if len(rows) < DLQ_PAGE and not full:
                break
        return {"replayed": replayed, "skipped": skipped}

    def remove_dlq(self, dlq_ids: Iterable[str]) -> Flow[int]:
        """Delete DLQ entries by id; the number that existed."""
        ids = list(dlq_ids) if not isinstance(dlq_ids, str) else [dlq_ids]
        bad = [i for i in ids if not isinstance(i, str) or not _STREAM_ID.fullmatch(i)]
        if bad:
            raise ConfigError(f"DLQ ids look like 1700000000000-0; got {bad[:5]!r}")
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
        k = self.keys
        last = yield command("XREVRANGE", k.dlq, "+", "-", "COUNT", 1)
        if not last:
            return 0
        last_id = str_reply(last[0][0])
        if reason is None and name is None:
            ms, seq = stream_id(last_id)
            return int_reply((yield command("XTRIM", k.dlq, "MINID", f"{ms}-{seq + 1}")))
        removed, start = 0, "-"
        while True:
            rows = (yield command("XRANGE", k.dlq, start, last_id, "COUNT", DLQ_PAGE)) or []
            doomed = []
            for entry_id, flat in rows:
                f = reply_pairs(flat or [])
                if (reason is None or str_reply(f.get("reason", b"")) == reason) and (
                    name is None or str_reply(f.get("n", b"")) == name
                ):
                    doomed.append(entry_id)
            if doomed:
                removed += int_reply((yield command("XDEL", k.dlq, *doomed)))
            if len(rows) < DLQ_PAGE:
                return removed
            start = "(" + str_reply(rows[-1][0])
