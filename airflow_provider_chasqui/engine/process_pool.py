"""``ProcessPool``: a worker's handlers in child processes (``Worker(processes=N)``,
``chasqui worker --processes N``), so a blocking or CPU-bound handler stalls neither the lease
renewal nor other jobs, CPU-bound work scales with cores, and a stuck handler can be killed.

Theory of operation.  The worker's event loop keeps reading, renewing and settling; a slot that
would call a handler sends the call to the pool instead (:meth:`ProcessPool.submit`), goes on to
its next queued job, and settles its calls as they end: they report to the slot's
:class:`Outcomes`, one wake-up for however many ended (a future per call cost a task step per job).  N children
(``engine/pool_child.py``; spawned, never forked, since the parent runs threads) imported the
handlers once; each runs the calls it is sent one after another and reports each outcome as
it ends, so the parent always knows which call a child is running: the oldest one it has not
reported, its *head*.  A child holds about ``HOLD_SECS`` of calls (from the recent average
call time), at least two (the running one and the next, so it never idles while a call
crosses the pipe) and up to ``RUN_MAX`` for quick ones, topped up as it reports (one pipe
message and one wake-up carry many short jobs).  Calls queued behind one that turns out
slow (running ``STEAL_SECS``) are asked back and go to an idle child; the child gives back
only those it had not started.

A timeout is timed from the moment a call becomes its child's head.  At the deadline, or when
the job is cancelled while at the head, the child is killed (SIGKILL): the call fails with
``JobTimeout`` (or ends cancelled), the calls queued behind it go back to the front of the line,
and a fresh child takes the dead one's place.  A call cancelled before it started is skipped by
its child.  A child that dies on its own (a crash, the kernel's OOM killer) or whose resident
memory passes ``memory_mb`` (checked every ``MEMORY_CHECK_SECS``) fails its head call with
``ChildProcessDied`` and is replaced likewise; a ``MemoryError`` in a handler fails that job and
the child exits after reporting it.  Only the job that was running is ever failed.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import multiprocessing
import os
import pickle
import select
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import ChildProcessDied, ConfigError, JobTimeout, UnrecoverableError
from ..types import Job
from .pool_calls import Call, CallCancelled, Outcomes
from .pool_child import NONE_BLOB, RemoteTraceback, child_main

__all__ = ["ProcessPool", "RUN_MAX", "MEMORY_CHECK_SECS", "check_picklable"]

log = logging.getLogger(__name__)
RUN_MAX = 32  # calls a child may hold at most (bounded so a kill re-queues few)
HOLD_SECS = 0.005  # ... and about this much work of them (so slow handlers are sent one at a time)
STEAL_SECS = 0.05  # calls queued behind one running this long move to an idle child
MEMORY_CHECK_SECS = 0.25
RESPAWN_SECS = 5.0  # a replacement that could not load the handlers is tried again this much later
START_TIMEOUT_SECS = 120.0  # importing the handlers (Spark, pandas...) can be slow on a busy box
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def check_picklable(handler: Any) -> bytes:
    """The handler as its children load it: module-level functions (or a mapping of them)
    pickle by name.  ``ConfigError`` naming the problem otherwise (a lambda, a closure)."""
    try:
        return pickle.dumps(handler)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same thing here
        raise ConfigError(
            "handlers that run in child processes (processes=N) must be importable by name "
            f"(module-level functions, or a mapping of them): {type(exc).__name__}: {exc}"
        ) from None


@dataclass(eq=False)
class _Child:
    number: int
    proc: Any  # multiprocessing.Process (spawn context)
    conn: Any  # its end of the pipe
    calls: dict[int, Call] = field(default_factory=dict)  # sent, not reported; the first one runs
    ready: bool = False
    gone: bool = False
    timer: asyncio.TimerHandle | None = None
    busy_since: float = 0.0  # when its current call (or the last report) began
    poller: Any = None  # select.poll() on its pipe: Connection.poll() builds a selector per call


class ProcessPool:
    """N child processes running one worker's handler calls (see the module docstring)."""

    def __init__(
        self, size: int, handler: Any, *, memory_mb: int | None = None, max_result_bytes: int = 0, label: str = "pool"
    ) -> None:
        self.size, self.memory_mb, self.label = size, memory_mb, label
        self.max_result_bytes = max_result_bytes  # a result packing past it fails in its child (0: not checked)
        self._payload = check_picklable(handler)
        self._ctx = multiprocessing.get_context("spawn")
        self._children: list[_Child] = []
        self._waiting: collections.deque[Call] = collections.deque()
        self._seq = 0
        self._dispatch_queued = False
        self._avg = HOLD_SECS  # seconds per call, recent average: starts slow (one call per child)
        self._depth = 2  # calls a child may hold (see _learn)
        self._closing = False
        self._progress: Any = None
        self._ready_waiter: asyncio.Future[None] | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._start_error = ""
        self._started = False
        self.replaced = 0  # children killed or dead and replaced

    # ---- life ---------------------------------------------------------------------------
    async def start(self, progress: Any = None) -> None:
        """Spawn the children and wait until each has loaded the handlers; ``ConfigError`` with
        the child's words if one cannot."""
        self._loop = asyncio.get_running_loop()
        self._progress = progress
        self._children = [self._spawn(i) for i in range(self.size)]
        deadline = time.monotonic() + START_TIMEOUT_SECS
        while not all(c.ready for c in self._children):
            failed = [c for c in self._children if c.gone]
            if failed:
                await self.close(0)
                raise ConfigError(f"{self.label}: a pool process could not load the handlers: {self._start_error}")
            if time.monotonic() > deadline:
                await self.close(0)
                raise ConfigError(f"{self.label}: pool processes not ready after {START_TIMEOUT_SECS:.0f} s")
            self._ready_waiter = self._loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready_waiter, 0.5)
        self._started = True
        self._monitor = asyncio.ensure_future(self._watch())

    def _spawn(self, number: int) -> _Child:
        mine, theirs = self._ctx.Pipe(duplex=True)
        proc = self._ctx.Process(
            target=child_main,
            args=(theirs, self._payload, self.max_result_bytes),
            name=f"chasqui-{self.label}-{number}",
            daemon=False,
        )
        proc.start()
        theirs.close()
        child = _Child(number, proc, mine, poller=select.poll())
        child.poller.register(mine.fileno(), select.POLLIN)
        self._loop.add_reader(mine.fileno(), self._readable, child)
        return child

    async def close(self, grace_secs: float = 5.0) -> None:
        """Stop every child: asked to exit (their calls are over by now), killed after ``grace_secs``."""
        self._closing = True
        if self._monitor is not None:
            self._monitor.cancel()
        for child in self._children:
            if not child.gone:
                with contextlib.suppress(OSError, ValueError):
                    child.conn.send(None)
        deadline = time.monotonic() + grace_secs
        for child in self._children:
            await self._loop.run_in_executor(None, child.proc.join, max(0.0, deadline - time.monotonic()))
            self._drop(child)
        for call in self._waiting:
            self._end(call, error=ChildProcessDied(f"{self.label}: the pool closed before job {call.job_id} ran"))

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self._children if not c.gone]

    # ---- calls --------------------------------------------------------------------------
    def outcomes(self) -> Outcomes:
        """A fresh box for :meth:`submit`."""
        return Outcomes()

    def submit(self, key: str | None, fields: Any, timeout_ms: int, box: Outcomes, batch: bool = False) -> Call:
        """Send a job's ``(id, name, data, attempt, created_at_ms)`` (or, ``batch``, a list of
        them) to a child; the call reports to ``box`` when it ends (read it with
        :meth:`outcome`).  ``timeout_ms`` (0: none) is timed from its start."""
        self._seq += 1
        call = Call(self._seq, key, batch, fields, timeout_ms, fields[0][0] if batch else fields[0], box)
        box.open += 1
        self._waiting.append(call)
        if not self._dispatch_queued:
            self._dispatch_queued = True
            self._loop.call_soon(self._dispatch)
        return call

    async def run(self, key: str | None, job: Job | list[Job], timeout_ms: int = 0) -> Any:
        """The handler's outcome for ``job`` (or a batch's list) from a child: its result, or its
        exception re-raised (caused by the child's traceback); ``JobTimeout`` past ``timeout_ms``."""
        box = Outcomes()
        fields = [(j.id, j.name, j.data, j.attempt, j.created_at_ms) for j in (job if isinstance(job, list) else [job])]
        call = self.submit(key, fields if isinstance(job, list) else fields[0], timeout_ms, box, isinstance(job, list))
        try:
            await box.wait()
        except asyncio.CancelledError:
            self.withdraw(call)
            raise
        return self.outcome(call)

    def outcome(self, call: Call) -> Any:
        """An ended call's result, or its exception raised (``CallCancelled`` if it was cancelled)."""
        if call.error is not None:
            raise call.error
        assert call.outcome is not None
        ok, blob = call.outcome
        if ok and blob == NONE_BLOB:
            return None
        try:
            value = pickle.loads(blob)
        except Exception as err:  # noqa: BLE001 - a value the child made that cannot be rebuilt here
            if ok:  # as a result that cannot be stored in process: running it again gives the same
                raise UnrecoverableError(
                    f"handler result cannot be read back from its pool process: {err!r}"[:4096]
                ) from None
            raise ChildProcessDied(f"the outcome of job {call.job_id} could not be read back: {err!r}") from None
        if ok:
            return value
        raised, text = value
        raise raised from RemoteTraceback(text)

    def cancel(self, call: Call) -> None:
        """End ``call`` as cancelled: taken back if not started, its child killed if running."""
        if not call.finished:
            self._end(call, error=CallCancelled(call.job_id))
            self.withdraw(call)

    def _end(self, call: Call, outcome: tuple[bool, bytes] | None = None, error: BaseException | None = None) -> None:
        if not call.finished:
            call.finished, call.outcome, call.error = True, outcome, error
            call.box._add(call)

    def _dispatch_soon(self) -> None:
        if not self._dispatch_queued:
            self._dispatch_queued = True
            self._loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        """Give waiting calls to children with room: each child holds at most ``self._depth``
        calls (sent, not reported), shared out evenly."""
        self._dispatch_queued = False
        depth = self._depth
        now = time.monotonic()
        open_ = [
            c
            for c in self._children
            if c.ready and not c.gone and len(c.calls) < depth and (not c.calls or now - c.busy_since < STEAL_SECS)
        ]
        while self._waiting and open_:
            child = open_.pop()
            n = min(depth - len(child.calls), max(1, -(-len(self._waiting) // (len(open_) + 1))))
            run: list[tuple[int, str | None, bool, Any]] = []
            while self._waiting and len(run) < n:
                call = self._waiting.popleft()
                if call.finished:  # withdrawn meanwhile
                    continue
                call.child = child
                child.calls[call.seq] = call
                run.append((call.seq, call.key, call.batch, call.fields))
            if not run:
                continue
            try:
                child.conn.send(("run", run))
            except Exception as exc:  # noqa: BLE001 - a dead pipe (the child died) or a payload that will not pickle
                if isinstance(exc, (OSError, EOFError)):
                    self._lost(child, None)
                    return
                for seq, *_rest in run:  # one job's data did not pickle: try them one by one
                    failed = child.calls.pop(seq)
                    failed.child = None
                    if len(run) == 1:
                        self._end(failed, error=ChildProcessDied(f"job {failed.job_id} cannot be sent: {exc!r}"))
                    else:
                        self._waiting.appendleft(failed)
                self._dispatch_soon()
                return
            if len(child.calls) == len(run):  # it was idle: its head starts now
                child.busy_since = time.monotonic()
                self._head_changed(child)
        if not self._waiting:
            self._rebalance(now)

    def _rebalance(self, now: float) -> None:
        """Calls queued behind a call that has run ``STEAL_SECS`` are asked back from their
        child (``skip``) when another child is idle; those the child had not started come back
        (``skipped``) and go to the idle one.  A call is never run by two children: only one
        not started is given back, and the child decides that under its own lock."""
        if not any(c.ready and not c.gone and not c.calls for c in self._children):
            return
        for child in self._children:
            if child.gone or len(child.calls) < 2 or now - child.busy_since < STEAL_SECS:
                continue
            behind = [call for call in list(child.calls.values())[1:] if not call.moving]
            if behind:
                for call in behind:
                    call.moving = True
                with contextlib.suppress(OSError, ValueError):
                    child.conn.send(("skip", [call.seq for call in behind]))

    def _learn(self, child: _Child, ended: int) -> None:
        """Size the calls a child may hold from how long calls take (an average over recent
        reports): ~``HOLD_SECS`` of work, and at least the running call and the next (so a child
        never idles while its next call crosses the pipe; one stuck behind a slow call moves to
        an idle child after ``STEAL_SECS``), up to ``RUN_MAX`` for quick ones."""
        now = time.monotonic()
        per_call = (now - child.busy_since) / ended
        child.busy_since = now
        self._avg = 0.8 * self._avg + 0.2 * per_call
        self._depth = max(2, min(RUN_MAX, int(HOLD_SECS / max(self._avg, 1e-7))))

    def _head_changed(self, child: _Child) -> None:
        """A new call runs in ``child``: time its timeout from now."""
        if child.timer is not None:
            child.timer.cancel()
            child.timer = None
        head = next(iter(child.calls.values()), None)
        if head is not None and head.timeout_ms:
            child.timer = self._loop.call_later(head.timeout_ms / 1000, self._expired, child, head)

    def _expired(self, child: _Child, call: Call) -> None:
        if child.calls and next(iter(child.calls.values())) is call and not call.finished:
            self._end(call, error=JobTimeout(call.timeout_ms, call.job_id))
            self._kill(child, f"job {call.job_id} ran past its timeout")

    def withdraw(self, call: Call) -> None:
        """``call`` is no longer wanted (``Queue.cancel``, the shutdown deadline): taken back
        if not started, its child killed if running."""
        child = call.child
        if child is None or child.gone:
            return  # still waiting: ``_dispatch`` drops it
        if next(iter(child.calls.values()), None) is call:
            self._kill(child, f"job {call.job_id} was cancelled while running")
        elif child.calls.pop(call.seq, None) is not None:
            with contextlib.suppress(OSError, ValueError):
                child.conn.send(("skip", [call.seq]))

    # ---- children's words -----------------------------------------------------------------
    def _readable(self, child: _Child) -> None:
        try:
            while not child.gone and child.poller.poll(0):
                msg = child.conn.recv()
                kind = msg[0]
                if kind == "done":
                    calls = child.calls
                    for seq, ok, blob in msg[1]:  # self._end, inline: once per pooled job
                        call = calls.pop(seq, None)
                        if call is not None and not call.finished:
                            call.finished, call.outcome = True, (ok, blob)
                            box = call.box
                            box.ended.append(call)
                            if box.waiter is not None:
                                box.nudge()
                    self._learn(child, len(msg[1]))
                    if child.calls:
                        self._head_changed(child)
                    elif child.timer is not None:
                        child.timer.cancel()
                        child.timer = None
                    self._dispatch_soon()
                elif kind == "skipped":
                    self._given_back(child, msg[1])
                elif kind in ("progress", "log"):
                    self._reported(msg)
                elif kind == "ready":
                    child.ready = True
                    self._dispatch_soon()
                    self._wake_starter()
                elif kind == "start_failed":
                    self._not_started(child, msg[1])
        except (EOFError, OSError):
            self._lost(child, None)

    def _reported(self, msg: tuple[Any, ...]) -> None:
        """A handler's progress (``("progress", job id, value, name)``) or log line
        (``("log", job id, line)``), checked in the child: recorded as an in-process one's."""
        if self._progress is None:
            return
        with contextlib.suppress(Exception):
            if msg[0] == "log":
                self._progress.log(msg[1], msg[2])
            else:
                self._progress.update(msg[1], msg[2], msg[3] if len(msg) > 3 else "")

    def _not_started(self, child: _Child, why: str) -> None:
        """A child could not load the handlers: at start the pool refuses to start; later (a
        replacement) it is tried again after ``RESPAWN_SECS``, the others working meanwhile."""
        self._start_error = why
        log.error("%s: pool process %d could not load the handlers: %s", self.label, child.proc.pid, why)
        self._drop(child)
        self._wake_starter()
        if self._started and not self._closing:
            self._loop.call_later(RESPAWN_SECS, self._respawn, child)

    def _respawn(self, child: _Child) -> None:
        if not self._closing and child in self._children:
            self._children[self._children.index(child)] = self._spawn(child.number)

    def _given_back(self, child: _Child, seqs: list[int]) -> None:
        """Calls the child had not started: first in line again (in their order)."""
        back = [call for seq in seqs if (call := child.calls.pop(seq, None)) is not None]
        for call in reversed(back):
            call.child, call.moving = None, False
            if not call.finished:
                self._waiting.appendleft(call)
        self._dispatch_soon()

    def _wake_starter(self) -> None:
        if self._ready_waiter is not None and not self._ready_waiter.done():
            self._ready_waiter.set_result(None)

    def _lost(self, child: _Child, why: str | None) -> None:
        """The child's pipe closed: it died (or exited after a ``MemoryError``)."""
        if child.gone:
            return
        child.proc.join(1.0)  # its pipe closed: it is exiting, so this wait is short
        code = child.proc.exitcode
        if not child.ready:
            self._not_started(
                child,
                f"it exited with code {code} before loading them (each pool process imports the main "
                "module, as multiprocessing's spawn does: a script that starts a worker with processes=N "
                'must do so under `if __name__ == "__main__":`)',
            )
            return
        said = why or (
            f"killed by signal {signal.Signals(-code).name}"
            if code is not None and code < 0 and -code in signal.valid_signals()
            else f"exited with code {code}"
        )
        self._fail_head(child, ChildProcessDied(f"{self.label}: pool process {child.proc.pid} {said}"))
        self._replace(child, said)

    def _kill(self, child: _Child, why: str) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            os.kill(child.proc.pid, signal.SIGKILL)
        self._fail_head(child, ChildProcessDied(f"{self.label}: pool process {child.proc.pid} killed: {why}"))
        self._replace(child, f"killed: {why}")

    def _fail_head(self, child: _Child, error: BaseException) -> None:
        calls = list(child.calls.values())
        child.calls.clear()
        if calls:
            self._end(calls[0], error=error)
        for call in reversed(calls[1:]):  # not started: first in line again, for another child
            call.child, call.moving = None, False
            if not call.finished:
                self._waiting.appendleft(call)

    def _replace(self, child: _Child, why: str) -> None:
        self._drop(child)
        if self._closing:
            return
        self.replaced += 1
        log.warning("%s: pool process %d %s; starting a new one", self.label, child.proc.pid, why)
        self._children[self._children.index(child)] = self._spawn(child.number)
        self._dispatch_soon()

    def _drop(self, child: _Child) -> None:
        if child.gone:
            return
        child.gone = True
        if child.timer is not None:
            child.timer.cancel()
        with contextlib.suppress(Exception):
            self._loop.remove_reader(child.conn.fileno())
        with contextlib.suppress(Exception):
            child.conn.close()
        if child.proc.is_alive():
            with contextlib.suppress(ProcessLookupError, OSError):
                os.kill(child.proc.pid, signal.SIGKILL)
        self._loop.run_in_executor(None, child.proc.join)  # reaped off the loop

    async def _watch(self) -> None:
        """Every ``STEAL_SECS``: move calls stuck behind a slow one (``_rebalance``); every
        ``MEMORY_CHECK_SECS`` with ``memory_mb``: kill a child whose resident memory passed it
        (Linux: ``/proc``)."""
        last_memory_check = 0.0
        while True:
            await asyncio.sleep(STEAL_SECS)
            now = time.monotonic()
            if not self._waiting:
                self._rebalance(now)
            if self.memory_mb and now - last_memory_check >= MEMORY_CHECK_SECS:
                last_memory_check = now
                self._check_memory(self.memory_mb * 1024 * 1024)

    def _check_memory(self, limit: int) -> None:
        for child in list(self._children):
            if child.gone or not child.calls:
                continue
            try:
                with open(f"/proc/{child.proc.pid}/statm", "rb") as f:
                    rss = int(f.read().split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                continue
            if rss > limit:
                head = next(iter(child.calls.values()))
                self._kill(
                    child,
                    f"job {head.job_id} took it past its memory limit ({rss >> 20} MB > {self.memory_mb} MB)",
                )
