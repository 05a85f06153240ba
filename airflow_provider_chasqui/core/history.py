"""Per-minute throughput history of a queue, kept in Redis for at least a week (sans-I/O).

Workers count the jobs they settle (completed runs and failed runs) per minute in memory and
add the counts to Redis with their heartbeat (``engine/intake.py``): no command on the per-job
path, one small pipeline every few seconds.  The dashboard reads them back for its charts, so
the history survives a dashboard or worker restart.

Layout: one hash per queue and UTC hour, ``{chasqui:<q>}:history:<hour>`` (hour = ms // 3.6e6),
with fields ``c<minute>`` (completed) and ``f<minute>`` (failed), minute 0-59, written only
for minutes that had jobs.  At most 120 fields keep the hash a listpack (Redis's and Valkey's
default ``hash-max-listpack-entries`` is 128), and every key expires ``RETAIN_MS`` after its
hour ends.  So a queue busy every minute holds at most ``RETAIN_MS / 1 h + 1`` = 193 keys;
``docs/dashboard.md`` gives the measured bytes (tests/dashboard/test_history.py measures them).

Counts are at least once in one sense only: a worker killed between beats loses the counts of
its last few seconds (they never reach Redis); nothing is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import ConfigError
from .calls import Call, Flow, command
from .key_types import read_types
from .keys import QueueKeys

__all__ = [
    "HOUR_MS",
    "MINUTE_MS",
    "RETAIN_MS",
    "MAX_HOURS_READ",
    "MinuteCounts",
    "read_calls",
    "parse_hours",
    "Series",
    "history_flow",
]

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
RETAIN_MS = 8 * 24 * HOUR_MS  # a week and a day: a week's chart is always whole
MAX_HOURS_READ = 8 * 24 + 1  # one read never asks for more keys than a queue can hold


@dataclass(slots=True)
class MinuteCounts:
    """A worker's counts not yet written: minute (ms // 60,000) -> [completed, failed]."""

    counts: dict[int, list[int]] = field(default_factory=dict)

    def add(self, now_ms: int, completed: int = 0, failed: int = 0) -> None:
        if completed <= 0 and failed <= 0:
            return
        slot = self.counts.get(now_ms // MINUTE_MS)
        if slot is None:
            self.counts[now_ms // MINUTE_MS] = [max(0, completed), max(0, failed)]
        else:
            slot[0] += max(0, completed)
            slot[1] += max(0, failed)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def take_calls(self, keys: QueueKeys) -> list[Call]:
        """The HINCRBYs (and one PEXPIREAT per hour touched) that write the counts; the counts
        are cleared: a failed write loses them rather than count them twice on a retry."""
        calls: list[Call] = []
        hours: set[int] = set()
        for minute, (done, failed) in sorted(self.counts.items()):
            hour, m = divmod(minute, 60)
            key = keys.history(hour)
            hours.add(hour)
            if done:
                calls.append(command("HINCRBY", key, f"c{m}", done))
            if failed:
                calls.append(command("HINCRBY", key, f"f{m}", failed))
        for hour in sorted(hours):
            calls.append(command("PEXPIREAT", keys.history(hour), (hour + 1) * HOUR_MS + RETAIN_MS))
        self.counts.clear()
        return calls


@dataclass(slots=True)
class Series:
    """Counts per bucket, oldest first, from ``start_ms`` in steps of ``step_ms``."""

    start_ms: int
    step_ms: int
    completed: list[int]
    failed: list[int]

    @property
    def total_completed(self) -> int:
        return sum(self.completed)

    @property
    def total_failed(self) -> int:
        return sum(self.failed)


def _whole_ms(what: str, value: object) -> int:
    """A span or step: a positive whole number of ms (never a float, bool or infinity), capped
    at what a queue holds."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"history {what} must be a positive whole number of milliseconds, got {value!r}")
    return min(value, RETAIN_MS + HOUR_MS)


def read_calls(keys: QueueKeys, now_ms: int, span_ms: int) -> tuple[list[int], list[Call]]:
    """The hours covering the last ``span_ms`` (bounded by what a queue can hold) and one
    HGETALL per hour."""
    span_ms = _whole_ms("span", span_ms)
    last = now_ms // HOUR_MS
    first = max(last - MAX_HOURS_READ + 1, (now_ms - span_ms) // HOUR_MS)
    hours = list(range(first, last + 1))
    return hours, [command("HGETALL", keys.history(hour)) for hour in hours]


def parse_hours(hours: list[int], replies: list[object], now_ms: int, span_ms: int, step_ms: int) -> Series:
    """Bucket the per-minute counts of ``hours`` into ``step_ms`` buckets, the last one holding
    the current minute.  Damaged fields (not ``c``/``f`` + minute, or not an integer) are skipped."""
    span_ms, step_ms = _whole_ms("span", span_ms), _whole_ms("step", step_ms)
    step = max(MINUTE_MS, step_ms - step_ms % MINUTE_MS)
    end = (now_ms // step + 1) * step  # whole buckets (whole hours for hourly ones), the last one current
    n = max(1, -(-span_ms // step))
    start = end - n * step
    completed, failed = [0] * n, [0] * n
    for hour, reply in zip(hours, replies):
        for name, value in _pairs(reply):
            kind, minute = name[:1], name[1:]
            if kind not in ("c", "f") or not minute.isdigit() or int(minute) > 59:
                continue
            try:
                count = int(value)
            except ValueError:
                continue
            at = hour * HOUR_MS + int(minute) * MINUTE_MS
            i = (at - start) // step
            if 0 <= i < n and count > 0:
                (completed if kind == "c" else failed)[i] += count
    return Series(start, step, completed, failed)


def _pairs(reply: object) -> list[tuple[str, str]]:
    if isinstance(reply, dict):
        items = list(reply.items())
    elif isinstance(reply, (list, tuple)):
        items = list(zip(reply[::2], reply[1::2]))
    else:
        return []
    return [(_text(k), _text(v)) for k, v in items]


def _text(value: object) -> str:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def history_flow(queue: str, now_ms: int, span_ms: int, step_ms: int) -> Flow[Series]:
    """The queue's counts over the last ``span_ms`` in ``step_ms`` buckets: the hours' types,
    then one pipeline of at most ``MAX_HOURS_READ`` HGETALLs of listpack hashes (a bounded
    read); an hour key of another type counts nothing."""
    hours, calls = read_calls(QueueKeys.for_queue(queue), now_ms, span_ms)
    types = yield from read_types([str(c.args[1]) for c in calls])  # another type (hostile): no counts
    kept = [(h, c) for h, c in zip(hours, calls) if types[str(c.args[1])] == "hash"]
    replies = (yield [c for _h, c in kept]) if kept else []
    return parse_hours([h for h, _c in kept], list(replies or []), now_ms, span_ms, step_ms)
