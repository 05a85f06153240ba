"""The read model's check of what each key holds before it reads it.

A key of another type than its role needs (foreign or hostile data in a queue's keyspace)
makes a read command fail with ``WRONGTYPE``, and in a pipeline it fails the whole view: one
spoiled key in any queue hid every queue from ``chasqui queues`` and the dashboard.  The views
read the ``TYPE`` of the keys they count first (one pipeline), read a key only when it holds its
type (``none`` reads as empty), and name the others in their ``spoiled`` field (key -> the type
found), so an operator sees what is wrong and everything else.  The scripts' twin is
``lua/include/key_types.lua``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .calls import Call, Flow, command, str_reply

__all__ = ["read_types", "spoiled_keys", "Reads", "spoiled_note", "written_types", "replace_spoiled"]


def read_types(keys: list[str]) -> Flow[dict[str, str]]:
    """``TYPE`` of each key in one pipeline: key -> ``string``, ``zset``, ..., or ``none``."""
    if not keys:
        return {}
    replies = yield [command("TYPE", k) for k in keys]
    return {k: str_reply(t) for k, t in zip(keys, replies)}


def spoiled_keys(found: Mapping[str, str], want: Mapping[str, str]) -> dict[str, str]:
    """The keys of ``want`` (key -> the type its role needs) holding another type."""
    return {k: found[k] for k, t in want.items() if found.get(k, "none") not in (t, "none")}


def spoiled_note(key: str, found: str, want: str) -> str:
    return f"{key} holds a {found}, not a {want} (foreign or hostile data): not read"


class Reads:
    """Named reads gathered for one pipeline, each only if its key holds the type it needs.

    ``add(name, key, want, call)`` queues ``call`` when ``key`` holds ``want``; ``run()`` sends
    them and returns name -> reply, a name left out reading as the default ``get`` is given.
    """

    __slots__ = ("types", "calls")

    def __init__(self, types: Mapping[str, str]) -> None:
        self.types = types
        self.calls: dict[str, Call] = {}

    def holds(self, key: str, want: str) -> bool:
        return self.types.get(key) == want

    def add(self, name: str, key: str, want: str, call: Call) -> None:
        if self.holds(key, want):
            self.calls[name] = call

    def run(self) -> Flow[dict[str, Any]]:
        if not self.calls:
            return {}
        replies = yield list(self.calls.values())
        return dict(zip(self.calls, replies))


# The type a plain write needs its key to hold (or be absent): the heartbeat's and the history's.
_WRITES = {"ZADD": "zset", "ZREM": "zset", "HINCRBY": "hash", "HSET": "hash"}


def written_types(calls: Iterable[Call]) -> dict[str, str]:
    """Key -> the type each plain write among ``calls`` needs (other calls are left out)."""
    out: dict[str, str] = {}
    for c in calls:
        want = _WRITES.get(str(c.args[0]).upper()) if c.script is None and len(c.args) > 1 else None
        if want is not None:
            out[str(c.args[1])] = want
    return out


def replace_spoiled(want: Mapping[str, str]) -> Flow[dict[str, str]]:
    """Delete the keys of ``want`` holding another type, so the next write recreates them; the
    keys replaced (key -> the type found).  For this project's own bookkeeping keys only (a
    worker's heartbeat and history counts), never for keys that hold jobs."""
    types = yield from read_types(list(want))
    bad = spoiled_keys(types, want)
    if bad:
        yield command("DEL", *bad)
    return bad
