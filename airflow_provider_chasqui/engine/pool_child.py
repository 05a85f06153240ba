"""The child side of a process pool (``engine/process_pool.py``): runs handler calls it is sent,
one after another, and reports each outcome as it ends.

Started by ``multiprocessing``'s *spawn* (never fork: the parent runs threads), it unpickles the
handler once (a module-level function or a mapping of them: pickled by name, so imported here),
then runs what its pipe brings.  Messages in: ``("run", [(seq, key, batch, fields), ...])``,
``("skip", [seq, ...])`` (calls taken back before they started: a job cancelled, or calls
moved to an idle child; answered ``("skipped", [seq, ...])`` for those not started) and
``None`` (stop).  Messages out:
``("ready",)`` or ``("start_failed", text)`` once, then ``("done", [(seq, ok, blob), ...])``
for calls that ended, in order (``blob`` the pickled result, or ``(exception, traceback
text)``: pickled apart, so a value the parent cannot unpickle fails its own job only)
and ``("progress", job_id, value)`` (at most every ``PROGRESS_SECS`` per job, the last one
before its ``done``).  It ignores SIGINT and SIGTERM (the parent decides when it stops: a
terminal's Ctrl-C reaches the whole process group) and dies with its parent (``PR_SET_PDEATHSIG``
on Linux), so a handler stuck in a loop never outlives the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Mapping
from multiprocessing.connection import Connection
from types import CoroutineType
from typing import Any

import msgpack

from ..core.job_logs import check_log_line
from ..core.running import ATTEMPT_ENDED, check_progress, result_too_large
from ..errors import UnrecoverableError
from ..types import Job, new_job

__all__ = ["child_main", "RemoteTraceback", "PROGRESS_SECS"]

PROGRESS_SECS = 0.1  # the parent coalesces further (engine/progress.py): this only bounds the pipe
# outcomes go out together (one message, one wake-up of the parent for many short jobs): when
# nothing is left to run, or FLUSH_COUNT are held, or the oldest was held FLUSH_SECS
FLUSH_COUNT = 32
FLUSH_SECS = 0.002
_MAX_TRACEBACK = 64 * 1024
_PR_SET_PDEATHSIG = 1
NONE_BLOB = pickle.dumps(None)  # most handlers return nothing: pickled once
_packb = msgpack.Packer(use_bin_type=True, autoreset=True).pack  # as the parent stores a result


class RemoteTraceback(Exception):
    """The traceback a handler raised with in a pool process, chained as the cause of the
    exception the parent re-raises (so the job's failure record shows the child's frames)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class _Progress:
    """``Job._progress`` in a child: checks the value where the handler called (``ConfigError``
    there, as in-process) and sends the latest per job, at most every ``PROGRESS_SECS``."""

    def __init__(self, conn: Connection, lock: threading.Condition) -> None:
        self.conn, self.lock = conn, lock
        self.sent: dict[str, float] = {}
        self.held: dict[str, Any] = {}

    def report(self, job: Any, value: Any) -> None:
        check_progress(value)
        job_id, now = job.id, time.monotonic()
        if now - self.sent.get(job_id, 0.0) >= PROGRESS_SECS:
            self.sent[job_id] = now
            self.held.pop(job_id, None)
            with self.lock:
                self.conn.send(("progress", job_id, value, job.name))
        else:
            self.held[job_id] = (value, job.name)

    def log(self, job: Any, line: Any) -> None:
        """A log line goes to the parent at once (it records it as an in-process one)."""
        line = check_log_line(line)
        with self.lock:
            self.conn.send(("log", job.id, line))

    def settle(self, job_ids: list[str]) -> None:
        """A call ended: its jobs' last held value goes out before its outcome."""
        for job_id in job_ids:
            self.sent.pop(job_id, None)
            if job_id in self.held:
                with self.lock:
                    self.conn.send(("progress", job_id, *self.held.pop(job_id)))


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _portable(exc: BaseException) -> tuple[BaseException, str]:
    """The exception as it can cross the pipe (itself if it pickles both ways, else an
    ``UnrecoverableError``-free stand-in naming its type) and its formatted traceback."""
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-_MAX_TRACEBACK:]
    except Exception:  # noqa: BLE001 - a hostile __str__: no traceback rather than no outcome
        text = ""
    try:
        clone = pickle.loads(pickle.dumps(exc))
        if type(clone) is not type(exc):
            raise TypeError("changed type")
    except Exception:  # noqa: BLE001 - any exception a handler raises must come back as a failure
        try:
            said = str(exc)
        except Exception:  # noqa: BLE001
            said = "<unprintable>"
        clone = RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {said}"[:4096])
    clone.__traceback__ = None
    return clone, text


def child_main(conn: Connection, payload: bytes, max_result_bytes: int = 0) -> None:
    """The child's whole life: load the handlers, then run calls until told to stop or orphaned."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    try:
        handler = pickle.loads(payload)
    except BaseException as exc:  # noqa: BLE001 - said to the parent, which refuses to start
        conn.send(("start_failed", f"{type(exc).__name__}: {exc}"))
        return
    runner = _Runner(conn, handler, max_result_bytes)
    conn.send(("ready",))
    threading.Thread(target=runner.listen, name="chasqui-pool-listener", daemon=True).start()
    with contextlib.suppress(BrokenPipeError, EOFError, ConnectionError):  # the parent is gone
        runner.serve()


class _Runner:
    """Two threads: this process's main thread runs the calls in order (``serve``); a listener
    (``listen``) takes the parent's messages at once, even while a call runs, so a call not
    yet started can be taken back (``skip``, answered ``skipped``), and sends outcomes held
    past ``FLUSH_SECS``.  Every send holds ``lock``."""

    def __init__(self, conn: Connection, handler: Any, max_result_bytes: int = 0) -> None:
        self.conn, self.handler = conn, handler
        self.max_result = max_result_bytes  # results are stored: one packing past it fails here (0: not checked)
        self.table = handler if isinstance(handler, Mapping) else None
        self.lock = threading.Condition()
        self.progress = _Progress(conn, self.lock)
        self.pending: deque[tuple[int, str | None, bool, Any]] = deque()
        self.done: deque[tuple[int, bool, bytes]] = deque()  # outcomes not yet sent
        self.first_done = 0.0
        self.running = False
        self.stop = False

    def _flush(self) -> None:  # with self.lock held: outcomes leave in order, each once
        done = self.done
        if done:
            sent = [done.popleft() for _ in range(len(done))]
            self.conn.send(("done", sent))

    def serve(self) -> None:
        """Run calls until told to stop: inside one event loop, so an ``async def`` handler is
        awaited in place (a loop per call cost more than the call); the loop blocks on the lock
        between calls, as nothing else runs on it."""
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        finally:
            loop.close()

    async def _serve(self) -> None:
        """The hot loop takes no lock per call: ``popleft`` starts a call (a ``skip`` that no
        longer finds it in ``pending`` was too late), ``append`` records an outcome, both atomic
        under the GIL; only sending, and waiting for work, hold ``lock`` (~1 us a call less)."""
        lock, pending, done = self.lock, self.pending, self.done
        monotonic = time.monotonic
        while True:
            try:
                seq, key, batch, fields = pending.popleft()
            except IndexError:
                with lock:
                    self.running = False
                    while not pending and not self.stop:
                        self._flush()  # nothing left to run: every outcome goes out now
                        lock.wait()
                    if self.stop:
                        self._flush()
                        return
                    self.running = True
                continue
            ok, blob, out_of_memory = await self.run(seq, key, batch, fields)
            if not done:
                self.first_done = monotonic()
            done.append((seq, ok, blob))
            if out_of_memory or len(done) >= FLUSH_COUNT:
                with lock:
                    self._flush()
            if out_of_memory:
                os._exit(70)  # a heap that ran out is not trusted with the next job: the parent replaces us

    def listen(self) -> None:
        """The parent's messages, and outcomes held too long; exits the process with the parent."""
        conn, lock = self.conn, self.lock
        poller = select.poll()  # once: Connection.poll() builds and registers a selector per call
        poller.register(conn.fileno(), select.POLLIN)
        try:
            while True:
                busy = self.running or self.pending or self.done
                if poller.poll(FLUSH_SECS * 1000 if busy else None):
                    msg = conn.recv()
                    with lock:
                        if msg is None:
                            self.stop = True
                            lock.notify()
                            return
                        if msg[0] == "run":
                            self.pending.extend(msg[1])
                            lock.notify()
                        elif msg[0] == "skip":
                            taken = self._take_back(set(msg[1]))
                            if taken:
                                conn.send(("skipped", taken))
                with lock:
                    if self.done and time.monotonic() - self.first_done >= FLUSH_SECS:
                        self._flush()
        except (EOFError, OSError):
            os._exit(0)  # the parent is gone: nobody is left to report to

    def _take_back(self, wanted: set[int]) -> list[int]:
        """Remove the calls ``wanted`` names that have not started (``serve`` pops a call, atomically,
        to start it: a call it popped first is not found, and runs)."""
        taken = []
        for call in [c for c in self.pending if c[0] in wanted]:
            with contextlib.suppress(ValueError):
                self.pending.remove(call)  # the same tuple object: matched by identity, no __eq__ of the data
                taken.append(call[0])
        return taken

    def _too_large(self, result: Any) -> UnrecoverableError | None:
        """The failure of a result that packs past ``max_result_bytes``, found here: a large
        result was pickled, sent and rebuilt in the parent only to be refused there.  One that
        does not pack is left to the parent, which says why it cannot be stored."""
        try:
            size = len(_packb(result))
        except Exception:  # noqa: BLE001
            return None
        return result_too_large(size, self.max_result) if size > self.max_result else None

    async def run(self, seq: int, key: str | None, batch: bool, fields: Any) -> tuple[bool, bytes, bool]:
        """``(ok, the pickled outcome, whether the handler ran out of memory)``."""
        progress = self.progress
        arg: Job | list[Job] = (
            [new_job(*f, None, progress) for f in fields] if batch else new_job(*fields, None, progress)
        )
        jobs = tuple(arg) if isinstance(arg, list) else (arg,)  # as made: a batch handler may change its list
        try:
            fn = self.handler if self.table is None else self.table[key]
            result = fn(arg)
            if type(result) is CoroutineType or (result is not None and inspect.isawaitable(result)):
                result = await result
            if batch and isinstance(result, (list, tuple)):  # a job's exception as it can cross, as a raised one
                result = [_portable(r)[0] if isinstance(r, BaseException) else r for r in result]
            ok, value = True, result
            if self.max_result and result is not None:
                if batch and isinstance(result, (list, tuple)):
                    value = [self._too_large(r) or r for r in result]
                elif (too_large := self._too_large(result)) is not None:
                    ok, value = False, (too_large, "")
        except BaseException as exc:  # noqa: BLE001 - every handler failure is reported, none ends the child
            ok, value = False, _portable(exc)
        for job in jobs:  # a task or thread the handler left reporting: its reports raise from now on
            object.__setattr__(job, "_progress", ATTEMPT_ENDED)
        if progress.sent or progress.held:
            progress.settle([j.id for j in jobs])
        if value is None:
            return ok, NONE_BLOB, False
        out_of_memory = not ok and isinstance(value[0], MemoryError)  # a failure is (exception, traceback)
        try:
            blob = pickle.dumps(value)
        except Exception as exc:  # noqa: BLE001 - a result that does not pickle fails its job, no more
            err = UnrecoverableError(f"handler result cannot be sent from its pool process: {exc!r}"[:4096])
            ok, blob = False, pickle.dumps((err, ""))
        return ok, blob, out_of_memory
