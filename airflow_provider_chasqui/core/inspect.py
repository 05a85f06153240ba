"""A read-only snapshot of a queue for people and scripts (``chasqui inspect``/``watch``).

One flow, two round trips: the counters in one pipeline, then consumer details only when
the stream and its group exist (XINFO on a missing group is an error, not an empty list).
Corrupt data renders instead of failing the snapshot: a spec key that is not UTF-8 shows
escaped, a score that is no instant (+-inf) shows as Redis' text of it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from .calls import Flow, command, int_reply, str_reply
from .keys import QueueKeys
from .schedules import show_key

__all__ = ["QueueSnapshot", "ConsumerInfo", "snapshot"]


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    name: str
    pending: int
    idle_ms: int


@dataclass(frozen=True, slots=True)
class QueueSnapshot:
    queue: str
    stream: int
    pending: int
    delayed: int
    oldest_delayed_lag_ms: int | None
    dlq: int
    specs: int
    paused_specs: int
    next_fires: list[tuple[str, int | str]]  # (spec key, epoch ms, or the score's text when no instant)
    promoter_leader: str | None
    scheduler_leader: str | None
    group_exists: bool
    consumers: list[ConsumerInfo] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _parse_info(flat: list[Any]) -> dict[str, Any]:
    return {str_reply(flat[i]): flat[i + 1] for i in range(0, len(flat) - 1, 2)}


def score_ms(raw: Any) -> int | str:
    """A ZSET score as epoch ms, or its text ("inf", "-inf") when it is no finite instant."""
    value = float(raw)
    return int(value) if math.isfinite(value) else str_reply(raw)


def snapshot(queue: str, *, group: str = "default", now_ms: int, next_fires: int = 5) -> Flow:
    k = QueueKeys.for_queue(queue)
    (stream, delayed, oldest, dlq, specs, paused, fires, promoter, scheduler, groups_exist) = yield [
        command("XLEN", k.stream),
        command("ZCARD", k.delayed),
        command("ZRANGE", k.delayed, 0, 0, "WITHSCORES"),
        command("XLEN", k.dlq),
        command("ZCARD", k.repeat),
        command("ZCARD", k.repeat_paused),
        command("ZRANGE", k.repeat, 0, max(0, next_fires - 1), "WITHSCORES"),
        command("GET", k.promoter_lock),
        command("GET", k.scheduler_lock),
        command("EXISTS", k.stream),
    ]
    consumers: list[ConsumerInfo] = []
    pending = 0
    group_exists = False
    if int_reply(groups_exist):
        groups = yield command("XINFO", "GROUPS", k.stream)
        for g in groups or []:
            info = _parse_info(g)
            if str_reply(info.get("name", b"")) == group:
                group_exists = True
                pending = int_reply(info.get("pending", 0))
        if group_exists:
            rows = yield command("XINFO", "CONSUMERS", k.stream, group)
            for row in rows or []:
                info = _parse_info(row)
                consumers.append(ConsumerInfo(str_reply(info["name"]), int_reply(info.get("pending", 0)),
                                              int_reply(info.get("idle", 0))))
    first = score_ms(oldest[1]) if oldest else None
    lag = max(0, now_ms - first) if isinstance(first, int) else None
    pairs = [(show_key(fires[i]), score_ms(fires[i + 1])) for i in range(0, len(fires or []), 2)]
    return QueueSnapshot(
        queue=queue, stream=int_reply(stream), pending=pending, delayed=int_reply(delayed),
        oldest_delayed_lag_ms=lag, dlq=int_reply(dlq), specs=int_reply(specs), paused_specs=int_reply(paused),
        next_fires=pairs, promoter_leader=str_reply(promoter) if promoter else None,
        scheduler_leader=str_reply(scheduler) if scheduler else None, group_exists=group_exists,
        consumers=consumers,
    )
