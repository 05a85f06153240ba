"""Following a queue's events stream ``{chasqui:<q>}:events``: one position-keeper, free of I/O.

Every follower reads the stream with plain XREAD (no consumer group): ``QueueEvents``, the
event hub's reader (``engine/event_hub.py``) and the blocking twin's waits
(``ProducerCore.wait_for_jobs``), the completion-mode trigger, ``chasqui events``.  They differ
in what they do with an entry; where they are, how they start, what they read, how a reply
moves them and whether entries after them were trimmed is :class:`EventCursor`, here once.
The caller runs the calls it gives (``pin_call``, ``read_call``, ``trim_call``) and hands back
the replies; a reply of the wrong shape (None, an error, odd entries) moves nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ..errors import ConfigError
from .calls import Call, command, reply_pairs, script_call, str_reply
from .codec import U64_MAX
from .event_hub import event_hits
from .keys import QueueKeys
from .settings import MAX_COUNT, MAX_MS, check_int

__all__ = ["START", "EventCursor", "is_stream_id", "stream_id", "after", "LAST_STREAM_ID"]

#: The position meaning "only entries added from now on"; ``pin`` turns it into an id.
START = "$"
# what XREAD takes as a position: ``<ms>-<seq>``, or ``<ms>`` (seq 0)
_STREAM_ID = re.compile(r"[0-9]+(?:-[0-9]+)?")
_STREAM_ID_BYTES = re.compile(rb"[0-9]+(?:-[0-9]+)?")


class _Default:
    """``read_call``'s "the cursor's own value" (``block_ms=None`` means "return at once")."""


_DEFAULT = _Default()


def is_stream_id(value: Any) -> bool:
    """True for a stream id as str or bytes (``<ms>-<seq>``, or ``<ms>``)."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str) or _STREAM_ID.fullmatch(value) is None:
        return False
    return all(len(part) <= 20 and int(part) <= U64_MAX for part in value.split("-"))  # Redis refuses more


#: The largest stream id: nothing can follow it, and ``XRANGE`` refuses ``(`` before it.
LAST_STREAM_ID = "18446744073709551615-18446744073709551615"
#: A read at the largest id waits at most this long: see ``EventCursor.stuck``.
STUCK_POLL_MS = 1_000


def after(entry_id: str) -> str | None:
    """The exclusive start (``(id``) of what follows ``entry_id`` in a range read; None after
    the largest id, where Redis refuses the range ("invalid start ID for the interval") and
    nothing can follow anyway (a hostile or foreign writer may have added it)."""
    return None if entry_id == LAST_STREAM_ID else "(" + entry_id


def _block(block_ms: object) -> int | None:
    """A read's BLOCK: None (return at once) or 1 ms to ten years (0 would be XREAD's forever,
    past every socket timeout)."""
    return None if block_ms is None else check_int("block_ms", block_ms, 1, MAX_MS)


def stream_id(value: str) -> tuple[int, int]:
    """``(ms, seq)`` of a stream id, for comparing two (``is_stream_id`` must hold)."""
    ms, _, seq = value.partition("-")
    return int(ms), int(seq or 0)


class EventCursor:
    """A position in one queue's events stream and the calls that move it.

    ``position`` is the id of the last entry read (the next read returns what follows it), or
    ``"$"`` before ``pin`` ran.  Pinning turns ``"$"`` into the stream's last id, so no entry
    slips between two reads.  A position that is neither is ``ConfigError``.
    """

    __slots__ = ("keys", "position", "_count", "_block_ms", "_read", "_read_at", "_below")

    def __init__(
        self, keys: QueueKeys, position: str = START, *, count: int = 100, block_ms: int | None = None
    ) -> None:
        self.keys = keys
        self.position = self._checked(position)
        self._count = check_int("count", count, 1, MAX_COUNT)
        self._block_ms = _block(block_ms)
        self._read: Call | None = None  # the default read_call, while the position stays
        self._read_at = ""
        self._below: str | None = None  # the position before it reached the largest id

    @property
    def count(self) -> int:
        """Entries per read."""
        return self._count

    @count.setter
    def count(self, value: int) -> None:
        self._count, self._read = check_int("count", value, 1, MAX_COUNT), None

    @property
    def block_ms(self) -> int | None:
        """How long a read blocks; None: it returns at once."""
        return self._block_ms

    @block_ms.setter
    def block_ms(self, value: int | None) -> None:
        self._block_ms, self._read = _block(value), None

    @staticmethod
    def _checked(position: Any) -> str:
        if position != START and not is_stream_id(position):
            raise ConfigError(f"an events position must be a stream id (<ms>-<seq>) or '$', got {position!r}")
        return str_reply(position)

    def seek(self, position: str) -> None:
        """Read on after ``position`` (a stream id, or ``"$"`` to pin again)."""
        self.position = self._checked(position)

    # ---- the start ---------------------------------------------------------------------------
    @property
    def pinned(self) -> bool:
        """False while the position is ``"$"`` (run ``pin_call`` and give ``pin`` its reply)."""
        return self.position != START

    def pin_call(self) -> Call:
        """The stream's last entry (XREVRANGE ... COUNT 1)."""
        return command("XREVRANGE", self.keys.events, "+", "-", "COUNT", 1)

    def pin(self, reply: Any) -> str:
        """Start after the entry ``pin_call`` found: ``"0-0"`` (the stream's start) when it found
        none, or the reply is not one (an error, a wrong-typed key).  Returns the position."""
        first = reply[0] if isinstance(reply, list) and reply else None
        if isinstance(first, (list, tuple)) and first and is_stream_id(first[0]):
            self.position = str_reply(first[0])
        else:
            self.position = "0-0"
        return self.position

    # ---- reading -----------------------------------------------------------------------------
    def read_call(self, count: int | None = None, block_ms: int | None | _Default = _DEFAULT) -> Call:
        """XREAD of the entries after the position: at most ``count`` (default ``self.count``),
        blocking ``block_ms`` (default ``self.block_ms``; None returns at once).  The default
        read is built once per position."""
        if count is None and block_ms is _DEFAULT:
            if self._read is None or self._read_at != self.position:
                self._read, self._read_at = self._xread(self.count, self.block_ms), self.position
            return self._read
        block = self.block_ms if isinstance(block_ms, _Default) else block_ms
        return self._xread(self.count if count is None else count, block)

    def _xread(self, count: int, block_ms: int | None) -> Call:
        if self.stuck and block_ms is not None:
            block_ms = min(block_ms, STUCK_POLL_MS)
        if block_ms is None:
            return command("XREAD", "COUNT", count, "STREAMS", self.keys.events, self.position)
        return command("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", self.keys.events, self.position)

    def consume(self, reply: Any) -> Iterator[tuple[str, list[Any]]]:
        """``(entry id, [field, value, ...])`` of each entry of an XREAD reply, oldest first;
        the position moves to each entry as it is handed out (a caller that stops early reads
        the rest again).  Anything malformed is skipped: a reply that is not a list, a row or
        an entry that is not a pair, an id that is not a stream id; a field list that is not a
        list is empty."""
        if type(reply) is not list:
            return
        match = _STREAM_ID_BYTES.fullmatch
        for row in reply:
            if type(row) not in (list, tuple) or len(row) != 2 or type(row[1]) is not list:
                continue
            for entry in row[1]:
                try:
                    entry_id, flat = entry
                except (TypeError, ValueError):
                    continue
                if type(entry_id) is bytes and match(entry_id):  # as Redis sends it
                    entry_id = entry_id.decode()
                elif type(entry_id) is str and _STREAM_ID.fullmatch(entry_id):
                    pass
                else:
                    continue
                if entry_id == LAST_STREAM_ID and not self.stuck:
                    self._below = self.position
                self.position = entry_id
                yield entry_id, flat if type(flat) is list else []

    def hits(self, reply: Any, by_job: dict[bytes, Any]) -> dict[str, tuple[str, str]]:
        """The first ending event of each job in ``by_job`` (``event_hits``: one dict lookup per
        entry), the position moved past the whole reply."""
        if not isinstance(reply, list):
            return {}
        try:
            last, found = event_hits(reply, by_job)
        except (TypeError, ValueError, IndexError):  # a malformed entry: the well-formed ones count
            return event_hits([(b"", list(self.consume(reply)))], by_job)[1]
        if last is not None and last != self.position and is_stream_id(last):
            if last == LAST_STREAM_ID:
                self._below = _id_before_last(reply) or self.position
            self.position = last
        return found

    # ---- the largest id ----------------------------------------------------------------------
    @property
    def stuck(self) -> bool:
        """At the largest id, which any writer may add: nothing can follow it (the stream is
        full), and once the stream is deleted or its last id lowered, every new id is below it.
        A read here waits at most ``STUCK_POLL_MS``; after one that brought nothing, a follower
        runs ``end_call`` and gives ``unstick`` its reply."""
        return self.position == LAST_STREAM_ID

    def end_call(self) -> Call:
        """The stream's last id, or ``''`` without a stream (``stream_last_id.lua``)."""
        return script_call("stream_last_id", (self.keys.events,), ())

    def unstick(self, reply: Any) -> bool:
        """Once the stream no longer ends at the largest id (made again, or its last id lowered),
        read on after the entry before that one.  True if the position moved."""
        if not self.stuck or str_reply(reply or b"") == LAST_STREAM_ID:
            return False
        self.seek(self._below or "0-0")
        self._below = None
        return True

    # ---- trimming ----------------------------------------------------------------------------
    def trim_call(self) -> Call:
        """XINFO STREAM: what ``trimmed`` reads."""
        return command("XINFO", "STREAM", self.keys.events)

    def trimmed(self, reply: Any) -> str | None:
        """The id range after the position whose entries were removed before they were read:
        ``"(<position>, <id>]"`` up to ``max-deleted-entry-id`` (XDEL), or ``"(<position>, <id>)"``
        before the oldest entry left when entries were removed and it is past the position
        (trimming, MAXLEN, moves no deleted marker; the range is empty only if the position's own
        entry was the last one trimmed).  None when nothing after the position is gone, or
        ``reply`` is not an XINFO STREAM reply (an error: no stream yet)."""
        if not isinstance(reply, list) or not self.pinned:
            return None
        f = reply_pairs(reply)
        at = stream_id(self.position)
        deleted = f.get("max-deleted-entry-id")
        if is_stream_id(deleted) and stream_id(str_reply(deleted)) > at:
            return f"({self.position}, {str_reply(deleted)}]"
        added, length = f.get("entries-added"), f.get("length")
        if not isinstance(added, int) or not isinstance(length, int) or added <= length:
            return None  # nothing was ever removed (or a reply without the counts: Redis < 7)
        first = f.get("first-entry")
        if isinstance(first, list) and first and is_stream_id(first[0]):
            oldest = str_reply(first[0])
            return f"({self.position}, {oldest})" if stream_id(oldest) > at else None
        last = f.get("last-generated-id")  # every entry removed: lost up to the last one added
        if length == 0 and is_stream_id(last) and stream_id(str_reply(last)) > at:
            return f"({self.position}, {str_reply(last)}]"
        return None


def _id_before_last(reply: Any) -> str | None:
    """The id of the next-to-last entry of a one-stream XREAD reply, if it has one."""
    try:
        entries = reply[-1][1]
        return str_reply(entries[-2][0]) if len(entries) > 1 else None
    except (TypeError, IndexError, KeyError):
        return None
