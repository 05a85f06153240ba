"""A Redis call as plain data, and the protocol that drives multi-step operations.

Operations are generators that ``yield`` a :class:`Call` (or a list of them, meaning "one
pipeline", or a :class:`Stream` of them) and receive the reply; their ``return`` value is the operation's result.  The
asyncio and blocking drivers both run the same generators, in the manner of httpx's
``auth_flow``, so the decisions live here once and the drivers only move bytes.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from . import scripts as _scripts
from .fast import fast_constructor
from .scripts import Script

__all__ = [
    "Call",
    "Stream",
    "Pause",
    "Flow",
    "script_call",
    "script_args",
    "command",
    "packed_command",
    "resp_bulk",
    "int_reply",
    "str_reply",
    "reply_pairs",
]


@dataclass(frozen=True, slots=True)
class Call:
    """One command (``args``) or one script invocation (``script`` + ``keys`` + ``argv``)."""

    args: tuple[Any, ...] = ()
    script: Script | None = None
    keys: tuple[Any, ...] = ()
    argv: tuple[Any, ...] = ()
    # ``args`` already encoded as a RESP request (hot paths build it from a cached prefix);
    # drivers that write raw bytes may send it instead of packing ``args`` again
    packed: bytes | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Stream:
    """Calls produced lazily, answered together: the driver sends each call as soon as the
    iterable yields it (so the next is built while Redis runs this one) and sends the flow
    the list of replies, in order.  For batches of independent calls (bulk writes, the
    scheduler's per-chunk scripts); a cluster client runs them as one pipeline."""

    calls: Iterable[Call]


@dataclass(frozen=True, slots=True)
class Pause:
    """Wait ``seconds`` before the next step (the driver sleeps; the flow is sent ``None``)."""

    seconds: float


Step = Call | list[Call] | Stream | Pause
_R = TypeVar("_R")
# a flow returning ``_R``: ``Flow[bool]``; a driver's ``run(flow)`` returns that ``_R``
Flow = Generator[Step, Any, _R]


def script_call(name: str, keys: tuple[Any, ...] | list[Any], argv: tuple[Any, ...] | list[Any]) -> Call:
    return Call(script=_scripts.SCRIPTS[name], keys=tuple(keys), argv=tuple(argv))


def script_args(c: Call, functions: bool) -> tuple[Any, ...]:
    """The command running script call ``c``: FCALL (FCALL_RO) of its function in the library
    when ``functions``, else EVALSHA of its SHA1.  (``engine/_wire.py``'s ``pack_call`` inlines it.)"""
    s = c.script
    assert s is not None
    if functions:
        return (s.fcall, s.function, len(c.keys), *c.keys, *c.argv)
    return ("EVALSHA", s.sha, len(c.keys), *c.keys, *c.argv)


def command(*args: Any) -> Call:
    return Call(args=args)


# ``Call(args=args, packed=packed)``: the hot paths' pre-packed commands, where a frozen
# dataclass' ``__init__`` would cost more than packing the command (see ``core.fast``)
packed_command = fast_constructor(Call, "args", "packed")


def resp_bulk(value: Any) -> bytes:
    """One argument as a RESP bulk string, encoded as redis-py and hiredis encode it
    (str as UTF-8, int in decimal, bytes as they are)."""
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif isinstance(value, int) and not isinstance(value, bool):
        value = str(value).encode("ascii")
    elif not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"cannot encode {type(value).__name__} as a RESP argument")
    return b"$%d\r\n%b\r\n" % (len(value), bytes(value))


def int_reply(value: Any) -> int:
    """Integer replies arrive as int, or as decimal strings from some Lua paths."""
    if isinstance(value, (bytes, str)):
        return int(value)
    return int(value or 0)


def str_reply(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def reply_pairs(flat: Any) -> dict[str, Any]:
    """A flat RESP ``[key, value, key, value...]`` list (a stream entry's fields, an XINFO reply)
    as a dict with str keys, values as they came; ``{}`` for anything that is not a list."""
    if not isinstance(flat, list):
        return {}
    return {str_reply(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}
