"""The asyncio driver: runs core Calls and flows on ``redis.asyncio``.

The only asyncio code that touches Redis for producers, workers and triggers.  Replies are
kept raw (no redis-py reshaping) so the core parses one format; scripts run as FCALL of the
Redis Functions library when it is loaded (learnt once, see ``core/features.py``), else as
EVALSHA with SCRIPT LOAD on NOSCRIPT.  The error boundary: every public method lets redis-py
errors out only through ``drivers_common.translate_error`` (in its ``except`` block), as the
package's typed errors (``ChasquiConnectionError``, ``ScriptError`` and its subclasses).
Non-blocking calls (scripts, XADD, ...) take the "lane" of ``_wire.py``, one pinned connection
with a few microseconds of Python per call; the rest, and any call the lane could not
deliver, go through redis.asyncio (cluster clients always do); a write is re-sent only when
the lane never sent it (see ``_wire.resend_ok``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis import exceptions as rexc

from ..core.calls import Call, Flow, Pause, Stream, script_args
from ..core.features import (
    COMPAT,
    Features,
    detect_call,
    fast_paths_default,
    functions_mode,
    load_call,
    parse_features,
    probe_call,
    probe_found,
    scripts_denied,
)
from ..core.urls import DEFAULT_URL
from ..drivers_common import (
    BOUNDARY_ERRORS,
    already_loaded,
    evalsha_denied,
    lane_ok,
    pack_call,
    reply_named,
    resend_ok,
    translate_error,
)
from ..drivers_common import call_args as _args
from ..drivers_common import script_missing as _missing
from ..errors import NoScriptError, ScriptError
from ._clients import CLUSTER, raw_client, route_fcall
from ._wire import AsyncLane

__all__ = ["AsyncDriver", "translate_errors"]

_R = TypeVar("_R")


@contextlib.asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    """Redis errors of the block as the package's errors (for code holding a raw client)."""
    try:
        yield
    except BOUNDARY_ERRORS as exc:
        raise translate_error(exc) from exc


async def _get_connection(pool: Any) -> Any:
    try:
        return await pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return await pool.get_connection("EVALSHA")


class AsyncDriver:
    """One connection pool plus the feature flags of its server.  Task-safe."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        client: aioredis.Redis | None = None,
        fast_paths: bool | None = None,
        lane: bool = True,
        **client_kwargs: Any,
    ) -> None:
        self.url = url
        self.client = client if client is not None else raw_client(url, **client_kwargs)
        if client is not None:
            self.client.response_callbacks.clear()
        self._fast_paths = fast_paths_default() if fast_paths is None else fast_paths
        self._features: Features | None = None
        # scripts: FCALL (True) or EVALSHA (False); None until the first script call learns it
        mode = functions_mode()
        self._fn: bool | None = False if mode == "off" else None
        self._may_load = mode == "auto"  # FUNCTION LOAD is tried until the server refuses it
        self._detecting: asyncio.Future[None] | None = None  # the probe in flight, awaited by the others
        if isinstance(self.client, CLUSTER):
            route_fcall(self.client)
        # non-blocking calls share one pinned connection, past redis.asyncio (see ``_wire.py``)
        self._lane = AsyncLane(self.client.connection_pool) if lane and not isinstance(self.client, CLUSTER) else None

    async def features(self) -> Features:
        if self._features is None:
            self._features = parse_features(await self.call(detect_call())) if self._fast_paths else COMPAT
        return self._features

    async def call(self, c: Call) -> Any:
        try:
            if c.script is not None and self._fn is None:
                await self._detect_functions()
            lane = self._lane
            if lane is not None and lane_ok(c):
                proto = lane.live() or await lane.open()
                if proto is not None:
                    fut = proto.send(pack_call(c, self._fn))
                    try:
                        reply = await fut
                    except (rexc.ConnectionError, rexc.TimeoutError):
                        if not resend_ok(c):  # its bytes went out: it may have run, the caller decides
                            raise
                    else:
                        if not isinstance(reply, Exception):
                            return reply
                        if isinstance(reply, rexc.ReadOnlyError):  # a demoted master: reconnect via redis-py
                            lane.close()
                        elif c.script is None or not _missing(reply):
                            raise self._explain(c, reply)
            return await self._call(c)
        except BOUNDARY_ERRORS as exc:  # the error boundary (see drivers_common)
            raise translate_error(exc) from exc

    #: ``call``: kept for the callers of the days ``call`` let redis-py errors out
    run_call = call

    async def _call(self, c: Call) -> Any:
        if c.script is None:
            try:
                return await self.client.execute_command(*c.args)
            except rexc.ResponseError as exc:
                raise reply_named(c, exc) from exc
        if self._fn is None:
            await self._detect_functions()
        for attempt in range(3):  # FCALL -> library loaded, or EVALSHA -> SCRIPT LOAD -> EVALSHA
            functions = bool(self._fn)
            try:
                return await self.client.execute_command(*script_args(c, functions))
            except rexc.ResponseError as exc:
                if attempt == 2 or not _missing(exc):
                    raise self._explain(c, exc) from exc
                if isinstance(exc, rexc.NoScriptError):
                    await self.client.execute_command("SCRIPT LOAD", c.script.body)
                elif functions:
                    await self._library_missing()

    # ---- FCALL or EVALSHA ------------------------------------------------------------------
    async def _detect_functions(self) -> None:
        """Whether scripts run as FCALL: the library answers its probe, or it was missing and
        this connection loaded it.  One probe at a time: concurrent first calls wait for it.
        Connection errors propagate (the next call tries again)."""
        loop = asyncio.get_running_loop()
        while self._fn is None:
            pending = self._detecting
            if pending is not None and pending.get_loop() is loop:
                await asyncio.shield(pending)  # then its outcome, or our own probe if it failed
                continue
            done = self._detecting = loop.create_future()
            try:
                try:
                    found = probe_found(await self.call(probe_call()))
                except NoScriptError:  # the library is not loaded
                    found = await self._load_library()
                except ScriptError:  # FCALL unknown (Redis < 7) or not granted
                    found = False
                self._fn = found
            finally:
                self._detecting = None
                done.set_result(None)

    async def _load_library(self) -> bool:
        """FUNCTION LOAD on the server (on every master of a cluster); False when this
        connection may not (NOPERM) or the server cannot: scripts then run as EVALSHA."""
        if not self._may_load:
            return False
        call = load_call()
        try:
            if isinstance(self.client, CLUSTER):
                await self.client.initialize()
                nodes = self.client.get_primaries()
            else:
                nodes = [None]
            for node in nodes:
                try:
                    kw: dict[str, Any] = {} if node is None else {"target_nodes": node}
                    await self.client.execute_command(*call.args, **kw)
                except rexc.ResponseError as exc:
                    if not already_loaded(exc):
                        raise
        except rexc.ResponseError:
            self._may_load = False
            return False
        return True

    async def _library_missing(self) -> None:
        """An FCALL found no function (a restart without persistence, FUNCTION FLUSH, a node
        new to the cluster): load the library again, or run EVALSHA from now on."""
        if not await self._load_library():
            self._fn = False

    def _explain(self, c: Call, exc: Exception) -> Exception:
        """EVALSHA refused to a user that cannot FCALL either: say what to do."""
        if c.script is not None and evalsha_denied(exc):
            self._fn = None  # learn again on the next script call (the library may be loaded meanwhile)
            return rexc.ResponseError(scripts_denied(c.script.name))
        return reply_named(c, exc)

    async def pipeline(self, calls: list[Call]) -> list[Any]:
        """One round trip; scripts missing from the server are loaded and only they re-run."""
        try:
            if self._fn is None and any(c.script is not None for c in calls):
                await self._detect_functions()
            lane = self._lane
            if lane is not None and calls and all(lane_ok(c) for c in calls):
                proto = lane.live() or await lane.open()
                if proto is not None:
                    fn = self._fn
                    futures = [proto.send(pack_call(c, fn)) for c in calls]
                    try:
                        replies = [await f for f in futures]
                    except (rexc.ConnectionError, rexc.TimeoutError):
                        if not all(resend_ok(c) for c in calls):  # writes may have run: never sent twice
                            raise
                    else:
                        if not any(isinstance(r, rexc.ReadOnlyError) for r in replies):
                            return await self._settle(calls, replies)
                        lane.close()
            return await self._settle(calls, await self._pipe(calls))
        except BOUNDARY_ERRORS as exc:  # the error boundary (see drivers_common)
            raise translate_error(exc) from exc

    async def stream(self, calls: Iterable[Call]) -> list[Any]:
        """Send each call as the iterable produces it, on one connection, then read every reply
        (see ``core.calls.Stream``); a cluster client runs the calls as one pipeline."""
        try:
            if isinstance(self.client, CLUSTER):
                return await self.pipeline(list(calls))
            if self._fn is None:
                await self._detect_functions()
            lane = self._lane
            if lane is not None:
                proto = lane.live() or await lane.open()
                if proto is not None:
                    return await self._stream_lane(proto, calls)
            pool = self.client.connection_pool
            conn = await _get_connection(pool)
            sent: list[Call] = []
            replies: list[Any] = []
            failed: BaseException | None = None  # the producer's error: raised once the sent calls are answered
            it = iter(calls)
            try:
                while True:
                    try:
                        c = next(it)
                    except StopIteration:
                        break
                    except BaseException as exc:  # noqa: BLE001 - re-raised below
                        failed = exc
                        break
                    await conn.send_packed_command(conn.pack_command(*_args(c, bool(self._fn))), check_health=not sent)
                    sent.append(c)
                for _c in sent:
                    try:
                        replies.append(await conn.read_response())
                    except rexc.ResponseError as exc:
                        replies.append(exc)
            except BaseException:
                await conn.disconnect()
                raise
            finally:
                await pool.release(conn)
            settled = await self._settle(sent, replies)
            if failed is not None:
                raise failed
            return settled
        except BOUNDARY_ERRORS as exc:  # the error boundary (see drivers_common)
            raise translate_error(exc) from exc

    async def _stream_lane(self, proto: Any, calls: Iterable[Call]) -> list[Any]:
        """``stream`` on the lane: each call is written as produced; other calls (blocking
        ones) run on redis.asyncio in their turn.  A dropped connection fails the stream, as
        on a pool connection (the calls already sent may have run)."""
        sent: list[Call] = []
        pending: list[Any] = []
        failed: BaseException | None = None
        it = iter(calls)
        while True:
            try:
                c = next(it)
            except StopIteration:
                break
            except BaseException as exc:  # noqa: BLE001 - re-raised below, once the sent calls are answered
                failed = exc
                break
            sent.append(c)
            if lane_ok(c) and not proto.closed:
                pending.append(proto.send(pack_call(c, self._fn)))
            else:
                try:
                    pending.append(await self._call(c))
                except rexc.ResponseError as exc:
                    pending.append(exc)
        replies = [await p if isinstance(p, asyncio.Future) else p for p in pending]
        settled = await self._settle(sent, replies)
        if failed is not None:
            raise failed
        return settled

    async def _settle(self, calls: list[Call], replies: list[Any]) -> list[Any]:
        for _ in range(2):  # as in ``_call``: FCALL -> library loaded, or EVALSHA -> SCRIPT LOAD
            missing = [i for i, r in enumerate(replies) if _missing(r)]
            if not missing:
                break
            if self._fn and any(not isinstance(replies[i], rexc.NoScriptError) for i in missing):
                await self._library_missing()
            for body in {
                script_.body
                for i in missing
                if (script_ := calls[i].script) and isinstance(replies[i], rexc.NoScriptError)
            }:
                await self.client.execute_command("SCRIPT LOAD", body)
            again = await self._pipe([calls[i] for i in missing])
            for i, r in zip(missing, again):
                replies[i] = r
        for c, r in zip(calls, replies):
            if isinstance(r, Exception):
                raise self._explain(c, r)
        return replies

    async def _pipe(self, calls: Iterable[Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        functions = bool(self._fn)
        for c in calls:
            pipe.execute_command(*_args(c, functions))
        return await pipe.execute(raise_on_error=False)

    async def run(self, flow: Flow[_R]) -> _R:
        """Drive a core flow to completion (its calls leave redis-py errors translated)."""
        try:
            step = next(flow)
            while True:
                if isinstance(step, list):
                    reply = await self.pipeline(step)
                elif isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                    reply = None
                elif isinstance(step, Stream):
                    reply = await self.stream(step.calls)
                else:
                    reply = await self.call(step)
                step = flow.send(reply)
        except StopIteration as stop:
            result: _R = stop.value  # the flow's return value
            return result

    async def close(self) -> None:
        if self._lane is not None:
            self._lane.close()
        await self.client.aclose()
