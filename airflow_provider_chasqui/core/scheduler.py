"""The scheduler's tick as a flow (sans-I/O): read the due specs, plan their fires, fire them.

One tick is two round trips whatever the batch size (plus one per piece of a fire-all
backlog, below): ``fetch_due`` (the server's clock, the
due keys with their scores and stored fields), then ``schedule_batch`` calls (every spec's
fires and next score, each under a compare-and-set on the score read) streamed one chunk at
a time, so the next chunk is planned while Redis fires the previous one.  "Now" is Redis'
TIME, read once per tick by ``fetch_due`` (the promoter's clock too), never the leader's.

Every entry stands alone: a member that is not UTF-8, a spec key of another type, a spec or
ext that does not decode (found here), a counter HINCRBY rejects (found by the firing script,
before that spec's first write) all move that spec to the quarantine hash with the reason
(``TickResult.quarantined``) and the others fire; a score that is no instant (-inf,
negative) re-anchors its spec.  The score is the fire's identity,
together with the spec key: two schedulers leading at once, or an update that moved the
timeline while a tick was planning, can never fire the same window twice.

A fire-all backlog (up to 10,000 windows) is planned a piece at a time, at most
``FIRE_BUDGET`` windows per chunk: each piece is fenced by rescoring its spec to the next
unfired window, which the next piece (sent in a new stream, once that fence stands) expects,
so no step of a tick holds the event loop for long and each window still fires once.

Next fires are computed from the scheduled time, never from now (spec §15.3-15.4); specs
that share a pattern, scheduled time, ``start_after`` and policy share one computation per
tick.  Each fire's job id is a ULID whose time part is the scheduled time and whose random
part is a hash of spec key and scheduled time: the same fire always has the same id, so
downstream consumers can deduplicate and anyone can read a fire's lag off the stream.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgpack

from .calls import Call, Flow, Stream, script_call, str_reply
from .codec import Envelope, encode_envelope
from .controls import read_controls
from .cron import next_fire_after
from .keys import QueueKeys
from .repeat import FIRE_ALL_LIST_CAP, catchup_fires, catchup_next, plan_fires
from .running import timeout_calls
from .settings import MAX_COUNT, QueueSettings, check_int
from .spec_decode import DueSpec, SpecDecoder
from .spec_ext import NO_EXT, SpecExt
from .spec_reads import show_key

__all__ = ["SchedulerCore", "TickResult", "DueSpec", "fire_job_id", "DEFAULT_BATCH"]

DEFAULT_BATCH = 1000
DEFAULT_CHUNK = 250
FIRE_BUDGET = 1000  # a chunk also ends once it holds this many fires (fire-all catch-ups)
_Plans = list[tuple[str, str, int, int, str]]  # (op, key, first fire, next, reason) per entry of a chunk
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]  # 10 bits -> 2 characters
# fire_at_ms -> its 10 ULID time characters: a module-level memo of a pure function (many
# specs share a scheduled time), bounded (cleared past 4096); kept here, not on a scheduler,
# since ``fire_job_id`` is a plain function that tools and tests call too
_TIME_PART: dict[int, str] = {}
_blake2b = hashlib.blake2b


def _fire_envelope(spec_key: str, fire_at_ms: int, inner: bytes, now: int, retry: Any) -> bytes:
    """The envelope of one fire (attempt 0, created now; the retry override when the spec has one)."""
    jid = fire_job_id(spec_key, fire_at_ms)
    return _packb([jid, inner, now, 0]) if retry is None else encode_envelope(Envelope(jid, inner, now, 0, retry))


def fire_job_id(spec_key: str, fire_at_ms: int) -> str:
    """The job id of the fire of ``spec_key`` scheduled at ``fire_at_ms``: a canonical ULID
    (48-bit time = the scheduled time, 80 bits of BLAKE2b of time and key)."""
    head = _TIME_PART.get(fire_at_ms)
    if head is None:  # many specs share a scheduled time: its 10 characters are made once
        if len(_TIME_PART) > 4096:
            _TIME_PART.clear()
        t = fire_at_ms & 0xFFFF_FFFF_FFFF
        p = _PAIRS
        head = _TIME_PART[fire_at_ms] = (
            p[t >> 40] + p[(t >> 30) & 1023] + p[(t >> 20) & 1023] + p[(t >> 10) & 1023] + p[t & 1023]
        )
    v = int.from_bytes(_blake2b(b"%d\0%s" % (fire_at_ms, spec_key.encode()), digest_size=10).digest(), "big")
    p = _PAIRS
    return (
        head
        + p[v >> 70]
        + p[(v >> 60) & 1023]
        + p[(v >> 50) & 1023]
        + p[(v >> 40) & 1023]
        + p[(v >> 30) & 1023]
        + p[(v >> 20) & 1023]
        + p[(v >> 10) & 1023]
        + p[v & 1023]
    )


@dataclass(slots=True)
class TickResult:
    """What one tick did.  ``lag_ms``: the largest (now - scheduled) among fired specs."""

    now_ms: int
    due: int = 0
    fired: int = 0
    skipped: int = 0
    removed: int = 0
    lost: int = 0
    full: bool = False
    next_due_ms: int | None = None
    lag_ms: int | None = None
    quarantined: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    chunks: int = 0  # schedule_batch calls (each plans at most ``SchedulerCore.chunk`` specs)


def _fire_at(raw: Any) -> int | None:
    """The score read as a fire instant; None when it is none (negative, infinite, NaN)."""
    try:
        value = int(raw)
    except ValueError:
        f = float(str_reply(raw))
        if not math.isfinite(f):
            return None
        value = int(f)
    return value if value >= 0 else None


class _Corrupt(Exception):
    """An entry ``fetch_due`` found corrupt (its reason is the message)."""


def _reason(exc: Exception) -> str:
    if isinstance(exc, _Corrupt):
        return str(exc)
    if isinstance(exc, UnicodeDecodeError):
        return f"the spec key is not UTF-8 (byte {exc.start})"
    return f"{type(exc).__name__}: {exc}"


def _plan_fires(spec: DueSpec, fire_at: int | None, now: int) -> tuple[list[int], int] | None:
    """``plan_fires``, except that a score that is no instant re-anchors the spec at its
    first fire after now (nothing fires for it), and that a fire-all backlog of more than
    one window is not planned here (None: ``_Catchup`` plans it a piece per chunk).  Either
    way O(1) pattern evaluations beyond the fires themselves."""
    if fire_at is None:
        nxt = next_fire_after(spec.pattern, now, spec.start_after_ms)
        return [], 0 if nxt is None else nxt
    if spec.missed_fires.kind == "fire-all":
        cadence = next_fire_after(spec.pattern, fire_at, spec.start_after_ms)
        if cadence is not None and cadence >= now:
            return [fire_at], cadence
        return None
    return plan_fires(spec.pattern, fire_at, now, spec.start_after_ms, spec.missed_fires)


class _Catchup:
    """A fire-all backlog planned a piece per chunk (at most ``FIRE_BUDGET`` windows each), so
    no tick step plans 10,000 windows at once.  Each piece but the last rescores the spec to
    its next unfired window: that score fences the piece (a compare-and-set, like every fire)
    and is the one the next piece expects, so each window fires once, in order, and a tick
    cut short leaves the rest for the next tick.  ``left``: windows still allowed this tick."""

    __slots__ = ("raw_key", "key", "spec", "ext", "expected", "cursor", "left")

    def __init__(self, raw_key: Any, key: str, spec: DueSpec, ext: SpecExt, expected: Any, cursor: int) -> None:
        self.raw_key, self.key, self.spec, self.ext = raw_key, key, spec, ext
        self.expected, self.cursor = expected, cursor
        max_catchup = spec.missed_fires.max_catchup or 0
        self.left = min(max_catchup, FIRE_ALL_LIST_CAP)

    def piece(self, now: int, n: int) -> tuple[list[int], int, bool]:
        """The next up to ``n`` windows, the score to write after them, and whether more
        pieces follow (then that score is the next window, itself due)."""
        spec = self.spec
        fires, cursor = catchup_fires(spec.pattern, self.cursor, now, spec.start_after_ms, min(n, self.left))
        self.left -= len(fires)
        end = spec.end_before_ms
        if self.left > 0 and cursor is not None and cursor <= now and (end is None or cursor <= end):
            self.cursor = cursor
            return fires, cursor, True
        return fires, catchup_next(spec.pattern, cursor, now, spec.start_after_ms), False


def _skips_while_paused(raw_ext: Any) -> bool:
    """Whether a due spec's ext asks to skip fires while the queue is paused (an ext that does
    not decode: no; the plan quarantines it).  Only an ext of four to seven items (fixarray 0x94-0x97) can
    carry the policy: the others are not decoded here, the plan decodes them once."""
    if type(raw_ext) is not bytes or raw_ext[:1] not in (b"\x94", b"\x95", b"\x96", b"\x97"):
        return False
    try:
        return SpecExt.decode(raw_ext).skip_while_paused
    except Exception:  # noqa: BLE001 - found and reported by the plan
        return False


def _score(raw: Any) -> int:
    try:
        return int(raw)
    except ValueError:
        return int(float(str_reply(raw)))


class SchedulerCore:
    """Pure scheduler logic for one queue."""

    def __init__(
        self,
        queue: str,
        settings: QueueSettings | None = None,
        *,
        batch: int = DEFAULT_BATCH,
        chunk: int = DEFAULT_CHUNK,
    ) -> None:
        for name, value in (("batch", batch), ("chunk", chunk)):
            check_int(name, value, 1, MAX_COUNT)
        self.chunk = chunk
        self.keys = QueueKeys.for_queue(queue)
        self.settings = QueueSettings.given(settings)
        self.batch = batch
        self._spec_base = self.keys.repeat_spec("")
        self._decoder = SpecDecoder()  # its caches are this scheduler's own
        self.plans_computed = 0  # next-fire computations (specs sharing one are counted once per tick)
        self._paused = False  # the queue was paused at this tick (read only when a due spec skips then)
        self._timed: list[tuple[str, int, int]] = []  # this chunk's fires with their own timeout

    def tick(self, now: int | None = None) -> Flow[TickResult]:
        """One tick at ``now`` (epoch ms; None = the server's TIME, what schedulers use)."""
        k = self.keys
        reply = yield script_call("fetch_due", (k.repeat,), ("" if now is None else now, self.batch, k.prefix))
        now = int(reply[1])
        result = TickResult(now_ms=now)
        try:
            upcoming = None if reply[0] is None else _score(reply[0])
        except (ValueError, OverflowError):  # a +inf score: nothing due within reach
            upcoming = None
        it = iter(reply[2:])
        rows = list(zip(it, it, it, it))  # (key, score, spec, ext) per due spec
        result.due = len(rows)
        result.full = len(rows) >= self.batch
        result.next_due_ms = upcoming
        if not rows:
            return result
        self._paused = False
        if any(row[3] and _skips_while_paused(row[3]) for row in rows):  # read only when a due spec cares
            self._paused = (yield from read_controls(k)).paused
        cache: dict[Any, tuple[list[int], int] | None] = {}
        planned: list[tuple[_Plans, int]] = []  # each chunk's plans, and the timeout calls sent before it
        replies: list[Any] = []
        at: list[Any] = [0, None]  # the next row, the catch-up whose next piece comes first

        def calls() -> Iterator[Call]:  # chunk i+1 is planned while Redis fires chunk i
            while at[0] < len(rows) or at[1] is not None:
                self._timed = []
                call, plans, at[0], at[1] = self._plan(rows, at[0], now, cache, at[1])
                # the fires' own timeouts, kept before the fires (core/running.py; a fire the
                # script then refuses leaves a key that expires)
                before = timeout_calls(k, self._timed) if self._timed else []
                planned.append((plans, len(before)))
                yield from before
                yield call
                if at[1] is not None:
                    return  # its next piece expects the score this chunk writes: a new stream

        while at[0] < len(rows) or at[1] is not None:
            replies += yield Stream(calls())
        result.chunks = len(planned)
        gone: set[str] = set()
        pos = 0
        for plans, skip in planned:
            pos += skip
            self._account(result, plans, replies[pos], now, gone)
            pos += 1
        return result

    def _plan(  # noqa: PLR0915 - the per-chunk plan loop, inline for the tick's speed (bench_scheduler)
        self,
        rows: list[tuple[Any, ...]],
        start: int,
        now: int,
        cache: dict[Any, tuple[list[int], int] | None],
        carry: _Catchup | None = None,
    ) -> tuple[Call, _Plans, int, _Catchup | None]:
        """One ``schedule_batch`` call for the ``fetch_due`` rows from ``start`` (after the
        next piece of ``carry``), what each entry asked, the index of the first row left for
        the next chunk and the catch-up whose next piece opens it: a chunk ends after
        ``chunk`` specs or ``FIRE_BUDGET`` fires (a catch-up is cut into pieces to fit)."""
        argv: list[Any] = [now, self.settings.max_stream_len, self._spec_base, 0]
        body: list[Any] = []
        plans: _Plans = []
        budget = FIRE_BUDGET
        if carry is not None:
            argv.append(carry.raw_key)
            fires, nxt, more = carry.piece(now, budget)
            budget -= self._catchup_entry(carry, fires, nxt, more, now, body, plans)
            if more:
                return self._chunk(argv, body, plans), plans, start, carry
        end_row = min(len(rows), start + self.chunk)
        decode = self._decoder.decode
        i = start
        while i < end_row and budget > 0:
            raw_key, raw_score, raw_spec, raw_ext = rows[i]
            i += 1
            argv.append(raw_key)
            if raw_spec is None:  # a dangling ZSET entry: drop it unless the spec reappears
                body += ("D", raw_score)
                plans.append(("D", show_key(raw_key), 0, 0, ""))
                continue
            try:
                key = raw_key.decode() if type(raw_key) is bytes else str(raw_key)  # not UTF-8: quarantined
                if type(raw_spec) is list:  # fetch_due found the entry corrupt and says why
                    raise _Corrupt(str_reply(raw_spec[0]))
                spec = decode(raw_spec)
                ext = SpecExt.decode(raw_ext) if raw_ext else NO_EXT
                fire_at = _fire_at(raw_score)  # a -inf or negative score re-anchors the spec
                ck = (spec.ident, fire_at)
                if ck in cache:
                    plan = cache[ck]
                else:
                    self.plans_computed += 1
                    plan = cache[ck] = _plan_fires(spec, fire_at, now)
                if plan is None:  # a fire-all backlog: its first piece (the rest in later chunks)
                    assert fire_at is not None
                    catchup = _Catchup(raw_key, key, spec, ext, raw_score, fire_at)
                    piece = catchup.piece(now, budget)
            except Exception as exc:  # noqa: BLE001 - whatever a stored spec does, it is moved aside, not fired
                if type(raw_spec) is bytes:  # unless an upsert rewrites the spec meanwhile
                    body += ("Q", raw_score, "s", raw_spec)
                else:
                    body += ("Q", raw_score, "x", "")
                plans.append(("Q", show_key(raw_key), 0, 0, _reason(exc)))
                continue
            if plan is None:
                budget -= self._catchup_entry(catchup, *piece, now, body, plans)
                if piece[2]:
                    return self._chunk(argv, body, plans), plans, i, catchup
                continue
            fires, nxt = plan
            end = spec.end_before_ms
            deadline = ext.deadline_ms
            inner, retry = spec.payload_inner, ext.retry
            skip = self._paused and ext.skip_while_paused
            if (
                not skip
                and ext.side is None
                and ext.dedup is None
                and end is None
                and spec.limit is None
                and nxt > 0
                and len(fires) == 1
                and fires[0] == fire_at
                and fire_at <= now
                and (deadline is None or now - fire_at <= deadline)
            ):
                # the common case (one fire at the score read): a short entry
                # a rows.FireRow
                body += ("f", raw_score, nxt, spec.job_name, _fire_envelope(key, fire_at, inner, now, retry))
                plans.append(("F", key, fire_at, nxt, ""))
                if ext.timeout_ms:
                    self._timed.append((fire_job_id(key, fire_at), ext.timeout_ms, 0))
                continue
            if end is not None:
                fires = [f for f in fires if f <= end]
            budget -= len(fires)
            self._fires_entry(key, spec, ext, raw_score, fires, nxt, now, body, skip, self._timed)
            plans.append(("F", key, fires[0] if fires else 0, nxt, ""))
        return self._chunk(argv, body, plans), plans, i, None

    def _chunk(self, argv: list[Any], body: list[Any], plans: _Plans) -> Call:
        k = self.keys
        argv[3] = len(plans)
        argv += body
        keys = (k.stream, k.delayed, k.repeat, k.repeat_quarantine, k.controls, k.prioritized, k.groups, k.events)
        return script_call("schedule_batch", keys, argv)

    def _fires_entry(
        self,
        key: str,
        spec: DueSpec,
        ext: SpecExt,
        expected: Any,
        fires: list[int],
        nxt: int,
        now: int,
        body: list[Any],
        skip: bool = False,
        timed: list[tuple[str, int, int]] | None = None,
    ) -> None:
        """An 'F' entry: ``fires`` (chronological, within ``end_before``) then score ``nxt``;
        ``skip``: every fire is skipped and counted (``while_paused="skip"`` on a paused queue);
        ``timed`` gets each fire's own timeout (job id, ms, due in).  A spec with a priority or
        a group gets an 'S' entry: the same, with the side lane its due fires wait in; one with
        a deduplication id a 'U' entry, whose fires are added as ``add(dedup_id=...)`` adds
        them (the fires' job ids follow the pairs)."""
        deadline = ext.deadline_ms
        inner, retry = spec.payload_inner, ext.retry
        side, dedup = ext.side, ext.dedup
        head = (expected, nxt, spec.limit or 0, spec.end_before_ms or 0)
        if dedup is not None:
            did, mode, ttl = dedup
            body += ("U", *head, mode, ttl, self.keys.dedup(did), did, self.settings.events_max_len)
        elif side is not None:
            priority, group = side
            body += ("S", *head, priority, self.keys.group_jobs(group) if group else "", group)
        else:
            body += ("F", *head)
        body += (spec.job_name, len(fires))
        for at in fires:
            if skip or (deadline is not None and now - at > deadline):
                body += (at, b"")
            else:
                body += (at, _fire_envelope(key, at, inner, now, retry))
                if ext.timeout_ms and timed is not None:
                    timed.append((fire_job_id(key, at), ext.timeout_ms, max(0, at - now)))
        if dedup is not None:
            body += tuple(fire_job_id(key, at) for at in fires)

    def _catchup_entry(
        self, c: _Catchup, fires: list[int], nxt: int, more: bool, now: int, body: list[Any], plans: _Plans
    ) -> int:
        """The 'F' entry of one piece of a catch-up (op 'P' in the plans while more follow);
        the number of fires it spends."""
        end = c.spec.end_before_ms
        if end is not None:
            fires = [f for f in fires if f <= end]
        skip = self._paused and c.ext.skip_while_paused
        self._fires_entry(c.key, c.spec, c.ext, c.expected, fires, nxt, now, body, skip, self._timed)
        plans.append(("P" if more else "F", c.key, fires[0] if fires else 0, nxt, ""))
        c.expected = nxt
        return max(1, len(fires))

    @staticmethod
    def _account(result: TickResult, plans: _Plans, reply: list[Any], now: int, gone: set[str] | None = None) -> None:
        """Add one chunk's reply to ``result``.  ``gone``: the catch-ups whose last piece did
        not leave the spec in place (removed, quarantined, or its compare-and-set failed): the
        failed compare-and-set of their next piece is no new loss."""
        fired, skipped, removed, lost = (int(x) for x in reply[:4])
        result.fired += fired
        result.skipped += skipped
        result.removed += removed
        result.lost += lost
        next_due = result.next_due_ms
        trailer = reply[4 + len(plans)] if len(reply) > 4 + len(plans) else []
        corrupt = {int(trailer[j]) - 1: str_reply(trailer[j + 1]) for j in range(0, len(trailer), 2)}
        if gone is None:
            gone = set()
        for i, ((op, key, first, nxt, reason), status) in enumerate(zip(plans, reply[4:])):
            status = int(status)
            if status < 0:
                if key in gone:
                    result.lost -= 1
                elif op == "P":
                    gone.add(key)
                continue
            if op == "P" and status & 1:
                gone.add(key)
            if i in corrupt:  # its hash turned corrupt between the read and the fire
                result.quarantined.append((key, f"its hash is corrupt: {corrupt[i]}"))
            elif op == "Q":
                result.quarantined.append((key, reason))
            elif op == "D":
                result.dropped.append(key)
            else:
                if status >= 2:
                    lag = now - first
                    result.lag_ms = lag if result.lag_ms is None else max(result.lag_ms, lag)
                if op == "F" and not status & 1 and nxt > 0:
                    next_due = nxt if next_due is None else min(next_due, nxt)
        result.next_due_ms = next_due
