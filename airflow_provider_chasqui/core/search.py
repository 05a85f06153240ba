"""Job search by name, state and a data field, within bounded reads (sans-I/O; issue 28).

A look up by id is ``core/job_details.job_details``.  A search looks where each state lives, each
look bounded in entries and bytes, and says what it did not search:

* waiting and active: the stream, oldest first, through ``scan_entries.lua`` (filtered by
  name and by a needle inside Redis, at most ``window`` entries or ``MAX_SCAN_BYTES``), the
  active ones told apart by the group's pending list (``XPENDING``, at most ``window``);
* delayed: ``ZSCAN`` of the delayed set with a ``MATCH`` pattern (``ZSCAN_COUNT`` members a
  call, at most ``window`` members examined);
* failed: the DLQ, like the stream;
* completed: the newest ``window`` events (``completed`` ones; completed jobs keep no data, so
  a data-field search cannot find them).

A data field is a dotted path into the job's data (``customer.id``, ``items.0.sku``); it
matches when the value there equals the text given, or the JSON value it parses as.  Redis
first keeps only payloads holding the value's bytes (a string) or the field's last key; the
survivors are decoded and checked here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .calls import Flow, command, reply_pairs, str_reply
from .codec import decode_data, decode_envelope, split_member, utf8_text
from .keys import DEFAULT_GROUP, QueueKeys, check_consumer_name
from .maintenance import glob_escape
from .scan import ENVELOPE_ID_PREFIX, envelope_id, parse_scan, scan_call

__all__ = ["STATES", "Found", "SearchResult", "search_jobs", "field_matches"]

STATES = ("waiting", "active", "delayed", "failed", "completed")
WINDOW = 2000  # entries (members, events) each look examines at most
MAX_RESULTS = 50
MAX_SCAN_BYTES = 32 * 1024 * 1024  # bytes of stream/DLQ entries one look reads inside Redis
ZSCAN_COUNT = 20  # delayed members a ZSCAN call examines (matches come back whole)
MAX_TEXT = 1024  # characters of a name, field path or value


@dataclass(slots=True)
class Found:
    id: str
    name: str | None
    state: str
    at_ms: int | None  # when it entered where it is (stream/DLQ/event id time) or is due (delayed)


@dataclass(slots=True)
class SearchResult:
    found: list[Found] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was not searched, and why


def _text(what: str, value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"search {what} must be text, got {type(value).__name__}")
    if len(value) > MAX_TEXT or "\x00" in value:
        raise ConfigError(f"search {what} must be at most {MAX_TEXT} characters without NUL")
    utf8_text(value, f"search {what}")
    return value


def _lookup(data: Any, path: str) -> tuple[bool, Any]:
    for part in path.split("."):
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return False, None
    return True, data


def field_matches(data: Any, path: str, value: str) -> bool:
    """Whether ``data`` holds ``value`` at the dotted ``path`` (as text, or as the JSON it parses as)."""
    ok, found = _lookup(data, path)
    if not ok:
        return False
    if isinstance(found, str):
        return found == value
    try:
        wanted = json.loads(value)
    except ValueError:
        return False
    if isinstance(wanted, float) and not math.isfinite(wanted):
        return False
    if isinstance(found, bool) or isinstance(wanted, bool):  # true is not 1
        return found is wanted
    return bool(found == wanted)


def _needle(path: str | None, value: str | None) -> bytes:
    """What a matching payload must hold, byte for byte: the value when it is a string (msgpack
    keeps strings as their UTF-8), else the field's last key."""
    if path is None or value is None:
        return b""
    try:
        json.loads(value)
    except ValueError:
        return value.encode()
    return path.rsplit(".", 1)[-1].encode()


def search_jobs(  # noqa: C901, PLR0915 - one look per state, in a fixed order
    queue: str,
    *,
    group: str = DEFAULT_GROUP,
    name: str | None = None,
    state: str | None = None,
    data_field: str | None = None,
    value: str | None = None,
    limit: int = MAX_RESULTS,
    window: int = WINDOW,
) -> Flow[SearchResult]:
    """Jobs of ``queue`` matching every criterion given (see the module docstring)."""
    name, data_field, value = _text("name", name), _text("field", data_field), _text("value", value)
    check_consumer_name(group)
    state = _text("state", state)
    if state is not None and state not in STATES:
        raise ConfigError(f"search state must be one of {', '.join(STATES)}, got {state!r}")
    if (data_field is None) != (value is None):
        raise ConfigError("a data-field search needs both the field and the value")
    for what, n in (("limit", limit), ("window", window)):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100_000:
            raise ConfigError(f"search {what} must be a whole number from 1 to 100000, got {n!r}")
    k = QueueKeys.for_queue(queue)
    out = SearchResult()
    needle = _needle(data_field, value)

    def keep(job_id: str | None, job_name: str | None, where: str, at: int | None, raw: bytes | None) -> None:
        if job_id is None or len(out.found) >= limit or not wanted(where):
            return
        if data_field is not None and value is not None:
            try:
                data = decode_data(decode_envelope(raw or b"").inner)
            except Exception:  # noqa: BLE001 - a damaged payload does not match
                return
            if not field_matches(data, data_field, value):
                return
        out.found.append(Found(job_id, job_name or None, where, at))

    def wanted(where: str) -> bool:
        return state is None or state == where

    # 1. the stream: waiting and active
    if wanted("waiting") or wanted("active"):
        pending: set[str] = set()
        groups = yield command("XINFO", "GROUPS", k.stream)  # XPENDING on a missing group is an error
        if any(str_reply(reply_pairs(g).get("name", b"")) == group for g in groups or []):
            rows = yield command("XPENDING", k.stream, group, "-", "+", window)
            pending = {str_reply(r[0]) for r in rows or []}
        look = _Look(name or "", needle, data_field is not None, window, limit)
        yield from look.run(k.stream, "the stream", out, keep, lambda eid: "active" if eid in pending else "waiting")
    # 2. delayed
    if wanted("delayed") and len(out.found) < limit:
        pattern = (
            ("????" + glob_escape(name) if name else "") + "*" + (glob_escape(needle.decode()) + "*" if needle else "")
        )
        cursor, examined = "0", 0
        while len(out.found) < limit:
            cursor_b, flat = yield command("ZSCAN", k.delayed, cursor, "MATCH", pattern, "COUNT", ZSCAN_COUNT)
            cursor = str_reply(cursor_b)
            examined += ZSCAN_COUNT
            for i in range(0, len(flat or []), 2):
                try:
                    job_name, env_raw = split_member(bytes(flat[i]))
                except Exception:  # noqa: BLE001 - a foreign member is not a job
                    continue
                if name is not None and job_name != name:
                    continue
                keep(envelope_id(env_raw[:ENVELOPE_ID_PREFIX]), job_name, "delayed", int(float(flat[i + 1])), env_raw)
            if cursor == "0":
                break
            if examined >= window:
                out.notes.append(f"the delayed set: stopped after about {examined} members")
                break
    # 3. the DLQ: failed
    if wanted("failed") and len(out.found) < limit:
        look = _Look(name or "", needle, data_field is not None, window, limit)
        yield from look.run(k.dlq, "the DLQ", out, keep, lambda _eid: "failed")
    # 4. completed, from the events
    if wanted("completed") and len(out.found) < limit:
        if data_field is not None:
            out.notes.append("completed jobs keep no data: a data-field search does not find them")
        else:
            rows = yield command("XREVRANGE", k.events, "+", "-", "COUNT", window)
            for eid, flat in rows or []:
                f = reply_pairs(flat)
                if f.get("e") != b"completed" or (name is not None and str_reply(f.get("n", b"")) != name):
                    continue
                keep(
                    str_reply(f.get("id", b"")) or None,
                    str_reply(f.get("n", b"")),
                    "completed",
                    int(str_reply(eid).partition("-")[0]),
                    None,
                )
            if len(rows or []) >= window:
                out.notes.append(f"completed: only the newest {window} events were read")
    return out


@dataclass(frozen=True, slots=True)
class _Look:
    """One bounded ``scan_entries.lua`` look through a stream, oldest first."""

    name: str
    needle: bytes
    whole: bool  # the payloads come back whole (a data field is checked here)
    window: int
    limit: int

    def run(
        self,
        stream: str,
        label: str,
        out: SearchResult,
        keep: Callable[[str | None, str | None, str, int | None, bytes | None], None],
        state_of: Callable[[str], str],
    ) -> Flow[None]:
        call = scan_call(
            stream,
            "-",
            count=self.window,
            needle=self.needle,
            clip=0 if self.whole else ENVELOPE_ID_PREFIX,
            whole_d=self.whole,
            max_bytes=MAX_SCAN_BYTES,
            max_matches=self.limit,
            name=self.name,
        )
        reply = parse_scan((yield call))
        for eid, fields, _size in reply.matches:
            raw = fields.get("d", b"")
            at = int(eid.partition("-")[0])
            keep(envelope_id(raw[:ENVELOPE_ID_PREFIX]), str_reply(fields.get("n", b"")), state_of(eid), at, raw)
        if not reply.done and len(out.found) < self.limit:
            out.notes.append(f"{label}: searched the oldest {reply.scanned} entries only (a bound stopped the look)")
