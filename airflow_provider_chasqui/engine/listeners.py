"""Listeners, ``on(event, callback)``, of a ``Worker`` and a ``QueueEvents`` (chasquimq's and
BullMQ's listener API).

A callback gets the event's arguments.  One that returns an awaitable (an ``async def``) is run
as a task of the loop, kept until it ends.  An exception in a callback is logged and goes no
further: a listener never stops a worker or a follower.  Callbacks run on the event loop's
thread; an event raised on another thread (a plain handler's progress, from its thread) is
handed to the loop first.  With no listener of an event, emitting it costs a dict lookup.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Collection
from typing import Any

from ..errors import ConfigError, ConfigTypeError

__all__ = ["Listeners", "MAX_EVENT_NAME"]

log = logging.getLogger(__name__)

MAX_EVENT_NAME = 1024  # characters of an event name (``completed:<job id>`` included)


class Listeners:
    """The callbacks of one object, by event name.

    ``known`` (when given) are the names ``on`` accepts; a ``QueueEvents`` accepts any event
    name (other writers add kinds), and ``name:<job id>`` for one job's events."""

    def __init__(self, owner: str, known: Collection[str] | None = None) -> None:
        self.owner = owner
        self.known = known
        self._by: dict[str, list[Callable[..., Any]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop callbacks run on (the owner's, from its ``run``)."""
        self._loop, self._thread = loop, threading.get_ident()

    def check(self, event: object, callback: object) -> str:
        if not isinstance(event, str):
            raise ConfigTypeError(f"an event name must be a str, got {type(event).__name__}")
        if not event or len(event) > MAX_EVENT_NAME:
            raise ConfigError(f"an event name must have 1 to {MAX_EVENT_NAME} characters, got {len(event)}")
        if self.known is not None and event not in self.known:
            raise ConfigError(f"{self.owner} has no event {event[:80]!r}: it emits {', '.join(sorted(self.known))}")
        if not callable(callback):
            raise ConfigTypeError(f"a listener must be callable, got {type(callback).__name__}")
        return event

    def on(self, event: str, callback: Callable[..., Any]) -> Callable[..., Any]:
        self._by.setdefault(self.check(event, callback), []).append(callback)
        return callback

    def once(self, event: str, callback: Callable[..., Any]) -> Callable[..., Any]:
        """``callback`` for the next ``event`` only."""

        def one_shot(*args: Any) -> Any:
            self.off(event, one_shot)
            return callback(*args)

        self.on(event, one_shot)
        return callback

    def off(self, event: str, callback: Callable[..., Any] | None = None) -> None:
        """Remove ``callback`` from ``event`` (every listener of it when None); no error if absent."""
        if callback is None:
            self._by.pop(event, None)
            return
        found = self._by.get(event, [])
        if callback in found:
            found.remove(callback)
        if not found:
            self._by.pop(event, None)

    def __bool__(self) -> bool:
        return bool(self._by)

    def has(self, event: str) -> bool:
        return event in self._by

    def emit(self, event: str, *args: Any) -> None:
        callbacks = self._by.get(event)
        if not callbacks:
            return
        loop = self._loop
        if loop is not None and threading.get_ident() != self._thread:
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._call_all, event, list(callbacks), args)
            return
        self._call_all(event, list(callbacks), args)

    def _call_all(self, event: str, callbacks: list[Callable[..., Any]], args: tuple[Any, ...]) -> None:
        for callback in callbacks:
            try:
                out = callback(*args)
                if asyncio.iscoroutine(out) or isinstance(out, asyncio.Future):
                    task = asyncio.ensure_future(out)
                    self._tasks.add(task)
                    task.add_done_callback(self._ended)
            except Exception:
                log.exception("%s: a listener of %r raised", self.owner, event)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s: an async listener raised", self.owner, exc_info=task.exception())

    async def settle(self, timeout: float = 5.0) -> None:
        """Wait (up to ``timeout`` s) for the async callbacks still running, then cancel them."""
        if not self._tasks:
            return
        _done, pending = await asyncio.wait(list(self._tasks), timeout=timeout)
        for task in pending:
            task.cancel()
