"""A cancel that a Redis call swallowed must still end the task.

redis-py can lose a ``CancelledError`` that lands in a call: the call then ends normally, or
with a connection error once its connection is dropped (redis-py#2028; seen with redis 5.0.8
under load, issue 29), and on Python 3.11 ``asyncio.wait_for`` can turn one into a timeout.
``Task.cancelling()`` still counts the request, so a loop that goes on after a Redis call asks
here first: otherwise a cancelled waiter waits out its whole timeout and a triggerer cannot
stop its watcher.
"""

from __future__ import annotations

import asyncio

__all__ = ["raise_if_cancelling"]


def raise_if_cancelling() -> None:
    """Raise ``CancelledError`` if the current task was asked to stop."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
