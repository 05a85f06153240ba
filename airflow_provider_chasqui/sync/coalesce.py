"""Threads sharing one ``SyncQueue`` share round trips on their plain adds (issue 27): the blocking
twin of ``engine/coalesce.py``.  Flask, Django and Airflow tasks call ``SyncQueue.add`` from
many threads; a thread that finds no add in flight sends its job alone at once (after one GIL
turn when the last call answered several threads, so their next adds join it); threads that add
meanwhile queue up, and the first of them, woken when the call returns, sends every add queued
by then (at most ``MAX_BATCH``) as one ``enqueue_batch`` call, then hands the turn to the next
waiting thread.  Each thread returns when its own job is written, or raises the error of the call
that carried it.

The threads a call answered are woken in a chain, each waking the next as it wakes: released all
at once they fought for the GIL (16 threads: 49k adds/s with Redis replaced by nothing, against
60k chained; ``benchmarks/bench_engine.py``'s ``limit_thread_handoff_16`` is the interpreter's
own floor, one blocked thread woken per add).  A thread interrupted while it waits (Ctrl-C in
the main thread) leaves the line and passes on its turn and its place in the chain.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from ..core.producer import ADD_BATCH as MAX_BATCH
from ..core.producer import ProducerCore

__all__ = ["AddCoalescer"]

_new_lock = threading.Lock


class _Slot:
    """One thread's add.  ``done`` is a raw lock taken at creation and released once the add is
    written (or the thread must lead): a C-level wake-up, where ``threading.Event``'s Python
    condition variable cost several times as much per add."""

    __slots__ = ("envelope", "name_bytes", "done", "lead", "error", "next", "gone")

    def __init__(self, envelope: bytes, name_bytes: bytes) -> None:
        self.envelope, self.name_bytes = envelope, name_bytes
        self.done = _new_lock()
        self.done.acquire()
        self.lead = False  # woken to send the next batch (its own job among them)
        self.error: BaseException | None = None
        self.next: _Slot | None = None  # the thread of the same batch this one wakes when woken
        self.gone = False  # its thread was interrupted while it waited


class AddCoalescer:
    def __init__(self, driver: Callable[[], Any], core: ProducerCore) -> None:
        self._driver, self._core = driver, core  # the queue's driver, asked at each call
        self._forked()

    def _forked(self) -> None:
        """A fresh state: at start, and in a child forked while another thread's add was in flight
        (the child would otherwise wait forever for a call that is not its own)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._busy = False
        self._waiting: list[_Slot] = []
        self._answered = 0  # threads the last batch answered: they are about to add again

    def add(self, envelope: bytes, name_bytes: bytes) -> None:
        if os.getpid() != self._pid:
            self._forked()
        slot = _Slot(envelope, name_bytes)
        with self._lock:
            self._waiting.append(slot)
            lead = not self._busy
            self._busy = True
        try:
            if not lead:
                slot.done.acquire()  # released by the thread before it in the chain (or hands us the turn)
                if slot.next is not None:
                    slot.next.done.release()
                if not slot.lead:
                    if slot.error is not None:
                        raise slot.error
                    return
                time.sleep(0)  # let the threads the last batch just answered queue their next adds first
            elif self._answered > 1:  # the threads just answered add again now: wait one GIL turn for them
                time.sleep(0)  # (a lone thread never waits: its last call answered only itself)
            with self._lock:
                batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
        except BaseException as exc:
            if exc is not slot.error:
                self._leave(slot)
            raise
        try:
            if len(batch) == 1:
                self._driver().run_call(self._core.xadd_call(batch[0].envelope, batch[0].name_bytes))
            else:
                self._driver().run_call(self._core.batch_call([(s.envelope, s.name_bytes) for s in batch]))
        except BaseException as exc:  # noqa: BLE001 - every thread of the batch gets the error; the leader re-raises it
            for s in batch:
                s.error = exc
        finally:
            with self._lock:  # linked under the lock, so that a thread leaving meanwhile is skipped
                others = [s for s in batch if s is not slot and not s.gone]
                for before, after in zip(others, others[1:]):
                    before.next = after
                self._pass_turn(len(batch))
            if others:  # answered first, so their next adds can join the next batch
                others[0].done.release()
        if slot.error is not None:
            raise slot.error

    def _pass_turn(self, answered: int) -> None:
        """(Under the lock.)  The first waiting thread sends the next batch; none: no call is out."""
        if self._waiting:
            nxt = self._waiting[0]
            nxt.lead = True
            nxt.done.release()
        else:
            self._busy = False
            self._answered = answered

    def _leave(self, slot: _Slot) -> None:
        """``slot``'s thread was interrupted while it waited: an add not yet sent leaves the line
        (a turn it held passes on), and the thread it should wake is woken now."""
        with self._lock:
            slot.gone = True
            if slot in self._waiting:
                self._waiting.remove(slot)
                if slot.lead:
                    self._pass_turn(0)
            nxt, slot.next = slot.next, None
        if nxt is not None:
            nxt.done.release()
