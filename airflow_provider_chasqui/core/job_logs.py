"""A job's log lines (``await job.log(line)`` in a handler, ``Queue.get_job_logs``): chasquimq's
and BullMQ's job logs, sans I/O.

A handler's lines are recorded in its worker and written with its progress
(``engine/progress.py``): at most every 0.25 s, and before the job's outcome, so a finished
job's lines are all in Redis when its result is.  They live in the list
``{chasqui:<queue>}:logs:<job id>``, every attempt's in order, the newest ``MAX_LOG_LINES``
kept, for ``LOG_TTL_MS`` after the last line.  ChasquiMQ workers neither write nor read it.
"""

from __future__ import annotations

from ..errors import ConfigError, ConfigTypeError
from .calls import Call, Flow, command, int_reply, str_reply
from .key_types import read_types
from .keys import QueueKeys
from .running import PROGRESS_TTL_MS, check_job_id
from .settings import check_index

__all__ = ["MAX_LOG_LINE", "MAX_LOG_LINES", "LOG_TTL_MS", "check_log_line", "log_calls", "read_logs"]

MAX_LOG_LINE = 16 * 1024  # characters of one line
MAX_LOG_LINES = 1000  # lines kept per job (the newest)
LOG_TTL_MS = PROGRESS_TTL_MS  # a day after the last line, as its progress


def check_log_line(line: object) -> str:
    """A log line as a handler gives it: a str of at most ``MAX_LOG_LINE`` characters that
    encodes as UTF-8 (``ConfigError`` naming the problem otherwise)."""
    if not isinstance(line, str):
        raise ConfigTypeError(f"a log line must be a str, got {type(line).__name__}")
    if len(line) > MAX_LOG_LINE:
        raise ConfigError(f"a log line has at most {MAX_LOG_LINE:,} characters, got {len(line):,}")
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"a log line must encode as UTF-8: {exc.reason} at {exc.start}") from None
    return line


def log_calls(keys: QueueKeys, lines: dict[str, list[str]]) -> list[Call]:
    """RPUSH each job's new lines, keep the newest ``MAX_LOG_LINES``, renew the TTL."""
    calls: list[Call] = []
    for job_id, new in lines.items():
        key = keys.logs(job_id)
        calls += (
            command("RPUSH", key, *new[-MAX_LOG_LINES:]),
            command("LTRIM", key, -MAX_LOG_LINES, -1),
            command("PEXPIRE", key, LOG_TTL_MS),
        )
    return calls


def read_logs(
    queue: str, job_id: str, start: object = 0, end: object = -1, asc: object = True
) -> Flow[tuple[list[str], int]]:
    """``(lines, how many the job has)``: lines ``start`` to ``end`` inclusive, counted from
    the oldest (``asc``) or from the newest; negative indices count from the other end, as in
    LRANGE; out of range is clamped (never an error).  A key of another type reads as none."""
    check_job_id(job_id)
    first, last = check_index("start", start, -(2**62), 2**62), check_index("end", end, -(2**62), 2**62)
    if not isinstance(asc, bool):
        raise ConfigTypeError(f"asc must be a bool, got {type(asc).__name__}")
    key = QueueKeys.for_queue(queue).logs(job_id)
    if (yield from read_types([key]))[key] != "list":
        return [], 0
    if asc:
        count, rows = yield [command("LLEN", key), command("LRANGE", key, first, last)]
        return [str_reply(r) for r in rows or []], int_reply(count)
    # newest first: index i from the newest is -(i + 1) from the oldest
    count, rows = yield [command("LLEN", key), command("LRANGE", key, _flip(last), _flip(first))]
    return [str_reply(r) for r in reversed(rows or [])], int_reply(count)


def _flip(i: int) -> int:
    return -(i + 1)
