"""A queue's flow controls, stored in Redis so every worker obeys them together (issue 24).

They live in one hash, ``{chasqui:<queue>}:controls`` (``QueueKeys.controls``), under the
queue's hash tag; a queue that never used a control has no such key.  Today it holds one
field, ``paused`` = ``1``: no worker starts a new job of the queue until it is gone
(``Queue.pause()``/``resume()``).  Producers, the promoter and the scheduler go on.

The intake obeys the controls as it read them at most 100 ms before handing out a batch
(``CONTROLS_MAX_AGE_SECS``; a read per batch cost a fifth of the throughput), so a job starts
at most that long after ``pause()`` returned.  What a worker read while the queue is paused
it keeps (its lease renewed) and hands out after the resume; a worker killed meanwhile leaves
it to the others' lease recovery, and they hold it too.  Anything but the exact values this
module writes (a hostile or foreign value, a key of another type) reads as "no control".
"""

from __future__ import annotations

from dataclasses import dataclass

from .calls import Call, Flow, command
from .keys import QueueKeys

__all__ = ["Controls", "NO_CONTROLS", "controls_call", "parse_controls", "pause", "resume", "read_controls"]

PAUSED_FIELD = "paused"
_ON = b"1"


@dataclass(frozen=True, slots=True)
class Controls:
    """What the controls hash says, as the intake obeys it."""

    paused: bool = False


NO_CONTROLS = Controls()


def controls_call(keys: QueueKeys) -> Call:
    """The one read the intake makes per batch (``HGETALL``: one round trip for every control)."""
    return command("HGETALL", keys.controls)


def parse_controls(reply: object) -> Controls:
    """``HGETALL``'s reply (a flat list or a dict) as :class:`Controls`; anything unexpected
    (another key type's error, foreign values) is no control."""
    if isinstance(reply, dict):
        fields = {(k.encode() if isinstance(k, str) else k): v for k, v in reply.items()}
    elif isinstance(reply, list):
        fields = dict(zip(reply[::2], reply[1::2]))
    else:
        return NO_CONTROLS
    if not fields:
        return NO_CONTROLS
    paused = fields.get(PAUSED_FIELD.encode())
    return Controls(paused=(paused.encode() if isinstance(paused, str) else paused) == _ON)


def pause(keys: QueueKeys) -> Flow[None]:
    """Stop every worker starting new jobs of the queue (running ones finish)."""
    yield command("HSET", keys.controls, PAUSED_FIELD, _ON)


def resume(keys: QueueKeys) -> Flow[None]:
    """Let the workers start jobs again."""
    yield command("HDEL", keys.controls, PAUSED_FIELD)


def read_controls(keys: QueueKeys) -> Flow[Controls]:
    """The controls as the workers see them (``is_paused()``): a key of another type is none,
    as it is for them."""
    kind = yield command("TYPE", keys.controls)
    if kind not in (b"hash", "hash"):
        return NO_CONTROLS
    return parse_controls((yield controls_call(keys)))
