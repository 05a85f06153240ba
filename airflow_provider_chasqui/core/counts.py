"""A queue's job counts at one instant (``lua/job_counts.lua``): what ``Queue.get_job_counts``
answers and what the read model every viewer shares shows (``core/inspect.snapshot``: ``chasqui
inspect``, the dashboard, the metrics).

One read-only script reads the stream's length, the consumer group's lag and pending count, the
delayed set, the DLQ, the prioritized set and the ``paused`` control, so a job moving between
keys meanwhile (a retry from the stream to the delayed set, a promotion back) is counted once,
never missed or counted twice
(``tests/engine/test_introspection.py::test_counts_are_one_instants_while_jobs_retry``).  A key
of another type (hostile) counts as empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .calls import Call, int_reply, script_call
from .controls import PAUSED_FIELD, parse_controls
from .keys import QueueKeys

__all__ = ["Counts", "counts_call", "parse_counts"]


@dataclass(frozen=True, slots=True)
class Counts:
    stream: int  # entries in the stream: waiting, and read but not acknowledged
    waiting: int | None  # entries the group has not read (all: no group yet); None: Redis cannot tell
    active: int  # entries the group read and has not acknowledged (running, or to be reclaimed)
    delayed: int
    failed: int  # DLQ entries
    prioritized: int  # jobs added with a priority, not in the stream yet
    paused: bool

    @property
    def waiting_or_estimate(self) -> int:
        """``waiting``, or when Redis cannot tell, the entries not pending."""
        return self.waiting if self.waiting is not None else max(0, self.stream - self.active)


def counts_call(k: QueueKeys, group: str) -> Call:
    return script_call("job_counts", (k.stream, k.delayed, k.dlq, k.prioritized, k.controls), (group,))


def parse_counts(reply: Any) -> Counts:
    stream, waiting, active, delayed, failed, prioritized = (int_reply(v) for v in reply[:6])
    return Counts(
        stream=stream,
        waiting=None if waiting < 0 else waiting,
        active=active,
        delayed=delayed,
        failed=failed,
        prioritized=prioritized,
        paused=parse_controls([PAUSED_FIELD.encode(), reply[6]]).paused,
    )
