"""How a slot (``engine/worker_slots.py``) calls a plain handler in one of the worker's threads.

Its outcome comes back through an asyncio future, which cannot carry two exceptions:
``StopIteration`` (the future refuses it, so the slot waited forever and the job's lease was
renewed for good: a ``next()`` on an exhausted iterator) and ``GeneratorExit`` (thrown into the
waiting slot, it ended the slot).  :func:`in_thread` brings them back boxed (:class:`Raised`),
and the slot raises them as any other failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Raised", "in_thread"]


class Raised:
    """An exception an asyncio future cannot carry back from a handler's thread."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def in_thread(fn: Callable[..., Any], job: Any) -> Any:
    """``fn(job)`` in an executor thread; ``StopIteration`` and ``GeneratorExit`` come back boxed."""
    try:
        return fn(job)
    except (StopIteration, GeneratorExit) as exc:
        return Raised(exc)
