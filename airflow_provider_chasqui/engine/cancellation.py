"""A cancel that a Redis call swallowed must still end the task; an unblock that came too
early must not leave a blocked read running.

redis-py can lose a ``CancelledError`` that lands in a call: the call then ends normally, or
with a connection error once its connection is dropped (redis-py#2028; seen with redis 5.0.8
under load, issue 29), and on Python 3.11 ``asyncio.wait_for`` can turn one into a timeout.
``Task.cancelling()`` still counts the request, so a loop that goes on after a Redis call asks
here first: otherwise a cancelled waiter waits out its whole timeout and a triggerer cannot
stop its watcher.

One ``CLIENT UNBLOCK`` is not enough either: sent over another connection, it can reach the
server before the read it means to end (it answers 0), and that read then runs its whole block
(a wait returned 10 s after its job ended, in CI).  :func:`unblock_until_done` sends it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

__all__ = ["UNBLOCK_AGAIN_SECS", "raise_if_cancelling", "unblock_until_done"]

UNBLOCK_AGAIN_SECS = 0.05  # a reader still running this long after CLIENT UNBLOCK is sent another


def raise_if_cancelling() -> None:
    """Raise ``CancelledError`` if the current task was asked to stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def unblock_until_done(task: asyncio.Task[None], unblock: Callable[[], Awaitable[bool]]) -> None:
    """Call ``unblock`` (a ``CLIENT UNBLOCK`` of ``task``'s blocking read; it answers whether to
    go on trying) every ``UNBLOCK_AGAIN_SECS`` until ``task`` ends; then wait for it."""
    while not task.done() and await unblock():
        await asyncio.wait([task], timeout=UNBLOCK_AGAIN_SECS)
    await asyncio.wait([task])
