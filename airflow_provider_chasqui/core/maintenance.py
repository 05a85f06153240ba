"""Emptying a queue, as BullMQ's ``drain`` and ``obliterate``: flows for ``Queue``/``SyncQueue``.

Both start with one atomic script (``drain_begin`` / ``obliterate_begin``) that fixes what goes:
the stream's newest entry at that instant, and the delayed ZSET (and, for obliterate, every
index) moved aside to fresh keys of the queue's hash tag.  The rest is deleted a chunk per call
(``drain_stream``, ``purge_index``), so a queue of millions never blocks the server for long,
and what producers add meanwhile lands in the live keys, untouched by a drain.  Obliterate ends
with a cursor SCAN of ``{chasqui:<q>}*`` for the keys no index lists (idempotency and unique
markers, cursors); Redis Cluster routes no SCAN to one slot's node, so there that sweep is
skipped and those keys (all but cursors have a TTL) are left.
"""

from __future__ import annotations

import uuid
from typing import Any, TypeVar

from ..errors import ChasquiError, ConfigError
from .calls import Flow, command, int_reply, script_call, str_reply
from .keys import QueueKeys

__all__ = ["DrainReport", "ObliterateReport", "QueueInUse", "drain", "obliterate", "glob_escape", "CHUNK"]

CHUNK = 1000
ACTIVE_WINDOW_MS = 60_000
"""A consumer that read within this window counts as a live worker for ``obliterate``."""


class QueueInUse(ChasquiError):
    """``obliterate`` refused: workers are using the queue (pass ``force=True`` to go ahead)."""


_T = TypeVar("_T", bound="_Tally")


class _Tally(int):
    """A count that is also a report: the int chasquimq's ``drain``/``obliterate`` return (the
    total), with the parts as read-only attributes (``to_dict``).  Two reports are equal when
    their parts are; a report equals an int when the total does."""

    _parts: tuple[str, ...] = ()

    def __new__(cls: type[_T], **parts: Any) -> _T:
        if set(parts) != set(cls._parts):
            raise TypeError(f"{cls.__name__} takes {', '.join(cls._parts)}")
        self = int.__new__(cls, sum(v or 0 for v in parts.values()))
        for name in cls._parts:
            object.__setattr__(self, name, parts[name])
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Tally):
            return type(other) is type(self) and self.to_dict() == other.to_dict()
        return int(self) == other

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = int.__hash__

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._parts}


class DrainReport(_Tally):
    """The jobs ``drain`` deleted (an int: all of them), by where they waited."""

    _parts = ("waiting", "delayed")
    waiting: int  # stream entries deleted (never a delivered one), and prioritized and grouped jobs not yet in it
    delayed: int  # delayed jobs deleted


class ObliterateReport(_Tally):
    """What ``obliterate`` deleted (an int: every key and member counted)."""

    _parts = ("keys", "indexed", "swept")
    keys: int  # fixed keys deleted and indexes moved aside
    indexed: int  # members of those indexes (jobs, results, failure records, specs) deleted with their keys
    swept: int | None  # keys found by the final SCAN; None where it cannot run (Redis Cluster)


def glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN MATCH pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _chunk(chunk: int) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise ConfigError(f"chunk must be a positive int, got {chunk!r}")
    return chunk


def drain(queue: str, *, delayed: bool = True, chunk: int = CHUNK) -> Flow[DrainReport]:
    """Delete the waiting jobs (stream entries no group has read) and, with ``delayed``, the
    delayed ones; keep the running (pending) ones.  Returns a :class:`DrainReport`."""
    k = QueueKeys.for_queue(queue)
    chunk = _chunk(chunk)
    token = uuid.uuid4().hex
    aside, prio_aside = k.aside("draining", token), k.aside("draining:prioritized", token)
    groups_aside = k.aside("draining:groups", token)
    keys = (k.stream, k.delayed, aside, k.prioritized, prio_aside, k.groups, groups_aside)
    top, _moved, prioritized, groups = yield script_call("drain_begin", keys, (1 if delayed else 0,))
    top = str_reply(top)
    waiting = removed = 0
    more = bool(top)
    while more:
        n, again = yield script_call("drain_stream", (k.stream,), (top, chunk))
        waiting += int_reply(n)
        more = bool(int_reply(again))
    while int_reply(prioritized):  # jobs added with a priority wait too (core/priorities.py)
        n = int_reply((yield script_call("purge_index", (prio_aside,), (chunk, k.prefix, "delayed"))))
        waiting += n
        if n < chunk:
            break
    while int_reply(groups):  # and the jobs of every job group (core/groups.py)
        popped, jobs = yield script_call("drain_groups", (groups_aside,), (chunk, k.prefix))
        waiting += int_reply(jobs)
        if int_reply(popped) < chunk:
            break
    while delayed:
        n = int_reply((yield script_call("purge_index", (aside,), (chunk, k.prefix, "delayed"))))
        removed += n
        if n < chunk:
            break
    return DrainReport(waiting=waiting, delayed=removed)


# the indexes obliterate moves aside, and what their members name
_INDEXES = (
    ("delayed", "delayed"),
    ("results", ":result:"),
    ("failures", ":failure:"),
    ("repeat", ":repeat:spec:"),
    ("repeat_paused", ":repeat:spec:"),
    ("prioritized", "delayed"),  # members like the delayed set's: no per-job key to find
    ("groups", ":group:"),  # each member names a group, whose list of waiting jobs goes with it
)


def obliterate(
    queue: str, *, force: bool = False, sweep: bool = True, chunk: int = CHUNK, active_window_ms: int = ACTIVE_WINDOW_MS
) -> Flow[ObliterateReport]:
    """Delete every key of the queue.  Raises :class:`QueueInUse` (and deletes nothing) while
    workers use it, unless ``force``.  Returns an :class:`ObliterateReport`."""
    k = QueueKeys.for_queue(queue)
    chunk = _chunk(chunk)
    token = uuid.uuid4().hex
    moved = [getattr(k, name) for name, _ in _INDEXES]
    aside = [k.aside(f"obliterating:{name}", token) for name, _ in _INDEXES]
    fixed = (k.stream, k.dlq, k.events, k.promoter_lock, k.scheduler_lock, k.repeat_quarantine)
    ok, detail = yield script_call("obliterate_begin", (*fixed, *moved, *aside), (1 if force else 0, active_window_ms))
    if not int_reply(ok):
        raise QueueInUse(f"queue {queue!r} is in use: {str_reply(detail)}; stop its workers first, or force it")
    indexed = 0
    for key, (_, mode) in zip(aside, _INDEXES):
        while True:
            n = int_reply((yield script_call("purge_index", (key,), (chunk, k.prefix, mode))))
            indexed += n
            if n < chunk:
                break
    swept = None
    if sweep:
        swept = yield from _sweep(glob_escape(k.prefix) + "*", chunk)
    return ObliterateReport(keys=int_reply(detail), indexed=indexed, swept=swept)


def _sweep(pattern: str, chunk: int) -> Flow[int]:
    cursor, swept = "0", 0
    while True:
        cursor, found = yield command("SCAN", cursor, "MATCH", pattern, "COUNT", chunk)
        cursor = str_reply(cursor)
        if found:
            swept += int_reply((yield command("UNLINK", *found)))
        if cursor == "0":
            return swept
