"""What both drivers share: the lane's wire codec, the error boundary, cluster key helpers.

Neither twin owns this module: ``engine/`` (asyncio) and ``sync/`` (blocking) import it, and
neither imports the other's private names (``tests/core/test_core_imports.py`` checks it).

**The error boundary.**  Every redis-py error a driver method meets leaves it through
``translate_error`` as one of the package's errors (``errors.py``): a lost connection as
``ChasquiConnectionError``, an error reply as ``ScriptError`` or the subclass code branches on
(``BusyGroupError``, ``NoGroupError``, ``NoScriptError``, ``ReadOnlyReplicaError``,
``ClusterBusyError``), Redis' message kept.  This is the only module that reads Redis error
text (``tests/core/test_error_boundary.py`` enforces it); the drivers call ``translate_error``
only in ``except`` blocks, so the hot paths pay nothing for it.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis import exceptions as rexc
from redis._parsers.base import BaseParser
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from .core import scripts as _scripts
from .core.calls import Call, script_args
from .errors import (
    BusyGroupError,
    ChasquiConnectionError,
    ChasquiError,
    ClusterBusyError,
    ConfigError,
    NoGroupError,
    NoScriptError,
    ReadOnlyReplicaError,
    ScriptError,
    WrongTypeError,
)

__all__ = [
    "FCALLS",
    "IDLE_CHECK_S",
    "LANE_COMMANDS",
    "BOUNDARY_ERRORS",
    "REDIS_ERRORS",
    "RESEND_SAFE",
    "already_loaded",
    "reply_named",
    "call_args",
    "evalsha_denied",
    "function_missing",
    "lane_ok",
    "new_reader",
    "pack_call",
    "resend_ok",
    "script_missing",
    "stream_read_slot",
    "supported",
    "translate_error",
]

# ---- the lane's codec (engine/_wire.py, sync/_wire.py) -------------------------------------

# Non-blocking commands that leave no state on the connection: safe to share one connection
# between tasks.  Scripts (FCALL or EVALSHA) always qualify.  Anything else takes the redis-py path.
LANE_COMMANDS = frozenset(
    {
        "XADD",
        "ZADD",
        "GET",
        "MGET",
        "EXISTS",
        "XRANGE",
        "XREVRANGE",
        "XLEN",
        "ZCARD",
        "ZSCORE",
        "ZRANGE",
        "ZRANGEBYSCORE",
        "HGET",
        "HGETALL",
        "HMGET",
        "SET",
        "DEL",
        "UNLINK",
        "PING",
        "XPENDING",
        "XACK",
        "XCLAIM",
        "XAUTOCLAIM",
        "INCR",
        "HINCRBY",
        "EXPIRE",
        "PEXPIRE",
        "PEXPIREAT",
        "TTL",
        "PTTL",
        "TIME",
    }
)
# The lane commands that only read: sent again after the lane broke mid-call, they cannot
# write twice.  Writes and scripts are never re-sent once their bytes went out.
RESEND_SAFE = frozenset(
    {
        "GET",
        "MGET",
        "EXISTS",
        "XRANGE",
        "XREVRANGE",
        "XLEN",
        "ZCARD",
        "ZSCORE",
        "ZRANGE",
        "ZRANGEBYSCORE",
        "HGET",
        "HGETALL",
        "HMGET",
        "PING",
        "XPENDING",
        "TTL",
        "PTTL",
        "TIME",
    }
)
# A call after the lane sat idle this long first checks that the server did not close the socket
# (CLIENT KILL, idle ``timeout``, a restart) before writing on it: a write cannot be re-sent.
IDLE_CHECK_S = 0.001


def lane_ok(c: Call) -> bool:
    if c.packed is not None or c.script is not None:  # pre-packed calls are XADDs
        return True
    name = c.args[0] if c.args else None
    return type(name) is str and name in LANE_COMMANDS


def resend_ok(c: Call) -> bool:
    """Whether ``c`` may be sent again after its bytes went out (checked on errors only)."""
    return c.packed is None and c.script is None and bool(c.args) and c.args[0] in RESEND_SAFE


def pack_call(c: Call, functions: bool | None = False) -> bytes:
    """The RESP bytes redis-py would send for ``c`` (it packs with hiredis as well); a script
    call as FCALL of its function when ``functions``, else as EVALSHA (``core.calls.script_args``)."""
    if c.packed is not None:
        return c.packed
    s = c.script
    # hiredis' stub gives pack_command no return type (it returns bytes)
    if s is None:
        return hiredis.pack_command(c.args)  # type: ignore[no-any-return]
    if functions:
        return hiredis.pack_command((s.fcall, s.function, len(c.keys), *c.keys, *c.argv))  # type: ignore[no-any-return]
    return hiredis.pack_command(("EVALSHA", s.sha, len(c.keys), *c.keys, *c.argv))  # type: ignore[no-any-return]


def call_args(c: Call, functions: bool) -> tuple[Any, ...]:
    """The arguments redis-py's ``execute_command`` takes for ``c``."""
    return c.args if c.script is None else script_args(c, functions)


def new_reader() -> hiredis.Reader:
    """Replies as raw bytes; error replies become redis-py's exception classes (NOSCRIPT included)."""
    return hiredis.Reader(protocolError=rexc.InvalidResponse, replyError=BaseParser.parse_error)


def supported(conn: Any) -> bool:
    """RESP2 and no client-side cache: the lane parses plain RESP2 replies only."""
    return str(getattr(conn, "protocol", 2) or 2) == "2" and type(conn).__name__ != "CacheProxyConnection"


# ---- cluster routing -----------------------------------------------------------------------

FCALLS = frozenset({"FCALL", "FCALL_RO", "fcall", "fcall_ro"})


def stream_read_slot(encoder: Any, args: tuple[Any, ...]) -> int | None:
    """The slot of an XREAD/XREADGROUP's streams (the keys after ``STREAMS``), or None for a
    shape not known here (redis-py then decides)."""
    i = 0
    while i < len(args):
        a = args[i]
        tok = (a.decode() if isinstance(a, bytes) else a).upper() if isinstance(a, (str, bytes)) else None
        if tok == "STREAMS":
            rest = args[i + 1 :]
            if not rest or len(rest) % 2:
                return None
            slots = {key_slot(encoder.encode(k)) for k in rest[: len(rest) // 2]}
            if len(slots) != 1:
                raise RedisClusterException("XREAD streams of one call must share a hash slot")
            return slots.pop()
        if tok == "GROUP":
            i += 3
        elif tok in ("COUNT", "BLOCK", "CLAIM"):
            i += 2
        elif tok == "NOACK":
            i += 1
        else:
            return None
    return None


# ---- the error boundary --------------------------------------------------------------------
# Inside a driver, before the boundary, replies are still redis-py exceptions: these predicates
# read them (the script-loading dance, FUNCTION LOAD, EVALSHA refused by an ACL).


#: Redis' (and Valkey's) reply to an ``XADD *`` once a stream's last id is the largest one
STREAM_FULL = "exhausted the last possible ID"


def reply_named(c: Call, error: Exception) -> Exception:
    """An error reply about a key, with the key named: ``WRONGTYPE`` (the command's key, or a
    script's keys) and a full stream's refused ``XADD``.  Redis' own text names none, so an
    operator could not tell which of a view's keys is spoiled (a script's names only its
    generated function and line)."""
    text = str(error)
    if STREAM_FULL in text:
        if c.script is not None:
            what = f"a key of {', '.join(_text(k) for k in c.keys) or '?'} is full"
            how = f"the script {c.script.name} cannot add to it"
        else:
            what = f"{_text(c.args[1]) if len(c.args) > 1 else '?'} is full"
            how = f"{_text(c.args[0]).upper() if c.args else 'XADD'} cannot add to it"
        return rexc.ResponseError(
            f"{what} (its last id is the largest a stream can hold, so {how}; foreign or hostile data in the"
            " queue's keyspace): delete the stream (Redis 7.0 also lets XSETID lower its last id once that entry"
            " is deleted)"
        )
    if not text.startswith("WRONGTYPE"):
        return error
    if c.script is not None:
        keys = ", ".join(_text(k) for k in c.keys) or "?"
        return rexc.ResponseError(
            f"WRONGTYPE a key of {keys} holds another type than the script {c.script.name} needs"
            " (foreign or hostile data in the queue's keyspace)"
        )
    if not c.args:
        return error
    name = str(c.args[0]).upper()
    args = [_text(a) for a in c.args]
    if name in ("XREAD", "XREADGROUP") and "STREAMS" in (u := [a.upper() for a in args]):
        key = args[u.index("STREAMS") + 1] if u.index("STREAMS") + 1 < len(args) else "?"
    elif name in ("XINFO", "XGROUP", "OBJECT") and len(args) > 2:
        key = args[2]
    else:
        key = args[1] if len(args) > 1 else "?"
    return rexc.ResponseError(
        f"WRONGTYPE {key} holds another type than {name} needs (foreign or hostile data in the queue's keyspace)"
    )


def _text(arg: Any) -> str:
    return arg.decode("utf-8", "backslashreplace") if isinstance(arg, bytes) else str(arg)


def function_missing(error: BaseException) -> bool:
    """The reply of an FCALL whose function is not loaded on that server (or cluster node)."""
    return str(error).startswith("Function not found")


def already_loaded(error: BaseException) -> bool:
    """FUNCTION LOAD's reply when a library of that name is there (same name, same code)."""
    return str(error).startswith(f"Library '{_scripts.LIBRARY.name}' already exists")


def script_missing(reply: Any) -> bool:
    """A script reply that runs again once its script or function is loaded."""
    return isinstance(reply, rexc.NoScriptError) or (isinstance(reply, rexc.ResponseError) and function_missing(reply))


def evalsha_denied(error: BaseException) -> bool:
    """An ACL refused EVALSHA (the user may only FCALL)."""
    return isinstance(error, rexc.NoPermissionError) and "'evalsha'" in str(error)


#: redis-py's errors (its cluster client's are not RedisErrors)
REDIS_ERRORS = (rexc.RedisError, RedisClusterException)
#: What a driver's boundary catches: redis-py's errors, and a str argument with no UTF-8 (a lone
#: surrogate) that an entry point's check let through, refused as it is packed, before it is sent
BOUNDARY_ERRORS = (*REDIS_ERRORS, UnicodeEncodeError)

# Error-reply codes redis-py has no class for (it keeps the code in the message).
# UNBLOCKED: a blocked XREADGROUP whose stream (and so its group) was deleted meanwhile
_REPLY_CODES: dict[str, type[ScriptError]] = {
    "WRONGTYPE": WrongTypeError,
    "BUSYGROUP": BusyGroupError,
    "NOGROUP": NoGroupError,
    "UNBLOCKED": NoGroupError,
}
_REPLY_CLASSES: tuple[tuple[type[BaseException], type[ScriptError]], ...] = (
    (rexc.NoScriptError, NoScriptError),
    (rexc.ReadOnlyError, ReadOnlyReplicaError),
    (rexc.ClusterDownError, ClusterBusyError),
    (rexc.TryAgainError, ClusterBusyError),
    (rexc.MasterDownError, ClusterBusyError),
)


def translate_error(exc: BaseException) -> BaseException:
    """The package's error for a redis-py error (anything else is returned as it is).

    Call it in ``except`` blocks only: ``raise translate_error(exc) from exc``.
    """
    if isinstance(exc, (rexc.ConnectionError, rexc.TimeoutError, rexc.InvalidResponse)):
        return ChasquiConnectionError(f"Redis is unreachable: {exc}")
    if isinstance(exc, rexc.ResponseError):
        text = str(exc)
        for redis_cls, cls in _REPLY_CLASSES:
            if isinstance(exc, redis_cls):
                return cls(text)
        if function_missing(exc):
            return NoScriptError(text)
        code = text.split(" ", 1)[0]
        return _REPLY_CODES.get(code, ScriptError)(text)
    if isinstance(exc, UnicodeEncodeError):
        return ConfigError(f"a command argument is not text that encodes as UTF-8 (a lone surrogate): {exc}")
    if isinstance(exc, RedisClusterException) and isinstance(exc.__cause__, (rexc.ConnectionError, OSError)):
        return ChasquiConnectionError(f"Redis is unreachable: {exc}")  # no seed node answered
    if isinstance(exc, REDIS_ERRORS):  # DataError, a keyless command on a cluster...: a call built wrong
        return ChasquiError(f"{type(exc).__name__}: {exc}")
    return exc
