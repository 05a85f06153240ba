"""Job priorities (issue 24): the sans-I/O rules of the ``priority=`` job option.

A job added with ``priority=p`` (an int, 1 the most urgent) does not enter the stream at once:
it waits in the sorted set ``{chasqui:<queue>}:prioritized`` (``QueueKeys.prioritized``),
scored ``p * 2**37 + seq`` so a lower number runs first and jobs of one priority run in the
order they were added (``lua/add_prioritized.lua``; ``seq`` is the controls hash's
``prio_seq``, whose presence tells the workers the queue uses priorities).  A worker whose
group has read everything in the stream moves the most urgent of them to the stream's tail
(``lua/take_prioritized.lua``) and reads them as any other entry, so leases, retries, the DLQ
and the events are those of every job, and the stream's wire is unchanged: a job without a
priority is byte-identical to what it was, and it runs before every prioritized job (as in
BullMQ).  How the intake asks (and how often) is ``engine/intake.py``'s concern.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .calls import Call, script_call
from .keys import QueueKeys

__all__ = ["MAX_PRIORITY", "check_priority", "add_prioritized_call", "take_prioritized_call"]

MAX_PRIORITY = 2**16  # with a 37-bit sequence, every score is an exact double (< 2**53)


def check_priority(value: Any) -> int:
    """A priority as given by a user: an int from 1 (most urgent) to ``MAX_PRIORITY``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"priority must be an int (1 is the most urgent), got {type(value).__name__} {value!r}")
    if not 1 <= value <= MAX_PRIORITY:
        raise ConfigError(f"priority must be between 1 and {MAX_PRIORITY:,}, got {value!r}")
    return value


def add_prioritized_call(keys: QueueKeys, jobs: list[tuple[int, bytes]]) -> Call:
    """``add_prioritized.lua`` for ``(priority, member)`` pairs (the member as the delayed set
    encodes one: ``codec.encode_member``)."""
    argv: list[Any] = [len(jobs)]
    for priority, member in jobs:
        argv += (priority, member)
    return script_call("add_prioritized", (keys.controls, keys.prioritized), argv)


def take_prioritized_call(keys: QueueKeys, n: int, max_stream_len: int) -> Call:
    """``take_prioritized.lua``: the ``n`` most urgent prioritized jobs to the stream's tail."""
    return script_call("take_prioritized", (keys.prioritized, keys.stream), (n, max_stream_len))
