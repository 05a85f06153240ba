"""A Redis call as plain data, and the protocol that drives multi-step operations.

Operations are generators that ``yield`` a :class:`Call` (or a list of them, meaning "one
pipeline", or a :class:`Stream` of them) and receive the reply; their ``return`` value is the operation's result.  The
asyncio and blocking drivers both run the same generators, in the manner of httpx's
``auth_flow``, so the decisions live here once and the drivers only move bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Iterable, Union

from .scripts import SCRIPTS, Script

__all__ = ["Call", "Stream", "Flow", "script_call", "command", "int_reply", "str_reply"]


@dataclass(frozen=True, slots=True)
class Call:
    """One command (``args``) or one script invocation (``script`` + ``keys`` + ``argv``)."""

    args: tuple[Any, ...] = ()
    script: Script | None = None
    keys: tuple[Any, ...] = ()
    argv: tuple[Any, ...] = ()

    def describe(self) -> str:
        return f"script {self.script.name}" if self.script else str(self.args[0])


@dataclass(frozen=True, slots=True)
class Stream:
    """Calls produced lazily, answered together: the driver sends each call as soon as the
    iterable yields it (so the next is built while Redis runs this one) and sends the flow
    the list of replies, in order.  For batches of independent calls (bulk writes, the
    scheduler's per-chunk scripts); a cluster client runs them as one pipeline."""

    calls: Iterable[Call]


Step = Union[Call, list[Call], Stream]
Flow = Generator[Step, Any, Any]


def script_call(name: str, keys: tuple[Any, ...] | list[Any], argv: tuple[Any, ...] | list[Any]) -> Call:
    return Call(script=SCRIPTS[name], keys=tuple(keys), argv=tuple(argv))


def command(*args: Any) -> Call:
    return Call(args=args)


def int_reply(value: Any) -> int:
    """Integer replies arrive as int, or as decimal strings from some Lua paths."""
    if isinstance(value, (bytes, str)):
        return int(value)
    return int(value or 0)


def str_reply(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
