"""The blocking driver: the synchronous twin of ``engine/_driver.py`` (same method names).

Used by Airflow hooks and operators, which run in threads without an event loop.  As there,
non-blocking calls take a pinned connection past redis-py's per-call machinery (``_wire.py``),
and every public method lets redis-py errors out only through ``drivers_common.translate_error``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import redis
from redis import exceptions as rexc
from redis.cluster import RedisCluster

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
from ..core.urls import connection_options, split_cluster_flag
from ..drivers_common import (
    BOUNDARY_ERRORS,
    FCALLS,
    already_loaded,
    evalsha_denied,
    lane_ok,
    pack_call,
    reply_named,
    resend_ok,
    stream_read_slot,
    translate_error,
)
from ..drivers_common import call_args as _args
from ..drivers_common import script_missing as _missing
from ..errors import ChasquiConnectionError, NoScriptError, ScriptError
from ._sentinel import make_client
from ._wire import BUSY, SyncLane

__all__ = ["SyncDriver", "translate_errors"]

_R = TypeVar("_R")


def raw_client(url: str, *, cluster: bool | None = None, **kwargs: Any) -> redis.Redis:
    """A client with redis-py's reply reshaping switched off (``?cluster=true``: RedisCluster)."""
    url, use_cluster = split_cluster_flag(url, cluster)
    if use_cluster:
        kwargs.pop("single_connection_client", None)
        url, kwargs = connection_options(url, kwargs)  # RESP2, TLS checks, timeouts (make_client does it too)
        try:
            cluster_client = _RawCluster.from_url(url, decode_responses=False, **kwargs)
        except rexc.RedisClusterException as exc:  # no seed node answered: say so as for one server
            if isinstance(exc.__cause__, (rexc.ConnectionError, rexc.TimeoutError, OSError)):
                raise ChasquiConnectionError(f"Redis is unreachable: {exc}") from exc
            raise
        return _raw_cluster(cluster_client)  # type: ignore[return-value]
    client = make_client(url, decode_responses=False, **kwargs)  # redis+sentinel:// too
    client.response_callbacks.clear()
    return client


class _RawCluster(RedisCluster):
    """Finds an XREAD/XREADGROUP's slot from its STREAMS keys: redis-py asks a node
    (COMMAND GETKEYS) on every such call, one more round trip per read."""

    def determine_slot(self, *args: Any) -> int | None:
        if args and isinstance(args[0], str) and args[0].upper() in ("XREAD", "XREADGROUP"):
            slot = stream_read_slot(self.encoder, args[1:])
            if slot is not None:
                return slot
        return super().determine_slot(*args)


def _raw_cluster(client: RedisCluster) -> RedisCluster:
    """The sync cluster client parses replies with each node's own client: clear those too,
    including for nodes it connects to later (failover, resharding)."""
    client.cluster_response_callbacks.clear()
    manager = client.nodes_manager
    create: Callable[..., redis.Redis] = manager.create_redis_node

    def create_raw(host: str, port: int, **kw: Any) -> redis.Redis:
        node = create(host, port, **kw)
        node.response_callbacks.clear()
        return node

    manager.create_redis_node = create_raw  # type: ignore[method-assign]
    for node in manager.nodes_cache.values():
        if node.redis_connection is not None:
            node.redis_connection.response_callbacks.clear()
    return client


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    """Redis errors of the block as the package's errors (for code holding a raw client)."""
    try:
        yield
    except BOUNDARY_ERRORS as exc:
        raise translate_error(exc) from exc


def _route_fcall(client: RedisCluster) -> None:
    """FCALL's keys are read from the call, as redis-py reads EVALSHA's (it would ask a node,
    COMMAND GETKEYS, on every FCALL).  On the parser: the client's pipelines share it."""
    parser = client.commands_parser
    get_keys: Callable[..., Any] = parser.get_keys

    def keys(redis_conn: Any, *args: Any) -> Any:
        if args and args[0] in FCALLS and len(args) > 2:
            return list(args[3 : 3 + int(args[2])])
        return get_keys(redis_conn, *args)

    parser.get_keys = keys  # type: ignore[method-assign]


def _get_connection(pool: Any) -> Any:
    try:
        return pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return pool.get_connection("EVALSHA")


CLUSTER = RedisCluster


class SyncDriver:
    """One connection pool plus the feature flags of its server.  Thread-safe."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379",
        *,
        client: redis.Redis | None = None,
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
        self._detect_lock = threading.Lock()  # one probe at a time
        if isinstance(self.client, CLUSTER):
            _route_fcall(self.client)
        # non-blocking calls skip redis-py's per-call machinery (see ``sync/_wire.py``)
        self._lane = SyncLane(self.client.connection_pool) if lane and not isinstance(self.client, CLUSTER) else None

    def features(self) -> Features:
        if self._features is None:
            self._features = parse_features(self.call(detect_call())) if self._fast_paths else COMPAT
        return self._features

    def call(self, c: Call) -> Any:
        try:
            if c.script is not None and self._fn is None:
                self._detect_functions()
            lane = self._lane
            if lane is not None and lane_ok(c):
                try:
                    reply = lane.request(pack_call(c, self._fn))
                except (rexc.ConnectionError, rexc.TimeoutError):
                    if not resend_ok(c):  # its bytes went out: it may have run, the caller decides
                        raise
                    reply = BUSY  # a read: re-run on redis-py
                if reply is not BUSY:
                    if not isinstance(reply, Exception):
                        return reply
                    if not ((c.script is not None and _missing(reply)) or isinstance(reply, rexc.ReadOnlyError)):
                        raise self._explain(c, reply)
                    if isinstance(reply, rexc.ReadOnlyError):  # a demoted master: reconnect via redis-py
                        lane.close()
            return self._call(c)
        except BOUNDARY_ERRORS as exc:  # the error boundary (see drivers_common)
            raise translate_error(exc) from exc

    #: ``call``: kept for the callers of the days ``call`` let redis-py errors out
    run_call = call

    def _call(self, c: Call) -> Any:
        if c.script is None:
            try:
                return self.client.execute_command(*c.args)
            except rexc.ResponseError as exc:
                raise reply_named(c, exc) from exc
        if self._fn is None:
            self._detect_functions()
        for attempt in range(3):  # FCALL -> library loaded, or EVALSHA -> SCRIPT LOAD -> EVALSHA
            functions = bool(self._fn)
            try:
                return self.client.execute_command(*script_args(c, functions))
            except rexc.ResponseError as exc:
                if attempt == 2 or not _missing(exc):
                    raise self._explain(c, exc) from exc
                if isinstance(exc, rexc.NoScriptError):
                    self.client.execute_command("SCRIPT LOAD", c.script.body)
                elif functions:
                    self._library_missing()

    # ---- FCALL or EVALSHA (see engine/_driver.py) ----------------------------------------
    def _detect_functions(self) -> None:
        with self._detect_lock:
            if self._fn is not None:  # another thread probed meanwhile
                return
            try:
                found = probe_found(self.call(probe_call()))
            except NoScriptError:  # the library is not loaded
                found = self._load_library()
            except ScriptError:  # FCALL unknown (Redis < 7) or not granted
                found = False
            self._fn = found

    def _load_library(self) -> bool:
        if not self._may_load:
            return False
        call = load_call()
        nodes = self.client.get_primaries() if isinstance(self.client, CLUSTER) else [None]
        try:
            for node in nodes:
                try:
                    kw: dict[str, Any] = {} if node is None else {"target_nodes": node}
                    self.client.execute_command(*call.args, **kw)
                except rexc.ResponseError as exc:
                    if not already_loaded(exc):
                        raise
        except rexc.ResponseError:
            self._may_load = False
            return False
        return True

    def _library_missing(self) -> None:
        if not self._load_library():
            self._fn = False

    def _explain(self, c: Call, exc: Exception) -> Exception:
        if c.script is not None and evalsha_denied(exc):
            self._fn = None
            return rexc.ResponseError(scripts_denied(c.script.name))
        return reply_named(c, exc)

    def pipeline(self, calls: list[Call]) -> list[Any]:
        """One round trip; scripts missing from the server are loaded and only they re-run."""
        try:
            if self._fn is None and any(c.script is not None for c in calls):
                self._detect_functions()
            lane = self._lane
            if lane is not None and calls and all(lane_ok(c) for c in calls):
                fn = self._fn
                try:
                    replies = lane.request(b"".join([pack_call(c, fn) for c in calls]), len(calls))
                except (rexc.ConnectionError, rexc.TimeoutError):
                    if not all(resend_ok(c) for c in calls):  # writes may have run: never sent twice
                        raise
                    replies = BUSY
                if replies is not BUSY:
                    if not any(isinstance(r, rexc.ReadOnlyError) for r in replies):
                        return self._settle(calls, replies)
                    lane.close()
            return self._settle(calls, self._pipe(calls))
        except BOUNDARY_ERRORS as exc:  # the error boundary (see drivers_common)
            raise translate_error(exc) from exc

    def stream(self, calls: Iterable[Call]) -> list[Any]:  # noqa: PLR0915 - the blocking lane's send/read loop, inline as in the asyncio twin
        """Send each call as the iterable produces it, on one connection, then read every reply
        (see ``core.calls.Stream``); a cluster client runs the calls as one pipeline."""
        try:
            if isinstance(self.client, CLUSTER):
                return self.pipeline(list(calls))
            if self._fn is None:
                self._detect_functions()
            lane = self._lane
            sent: list[Call]
            replies: list[Any]
            failed: BaseException | None  # the producer's error: raised once the sent calls are answered
            if lane is not None:
                it = iter(calls)
                fn = self._fn
                done = lane.stream(it, lambda c: pack_call(c, fn))
                if done is not BUSY:
                    sent, replies, failed = done
                    settled = self._settle(sent, replies)
                    if failed is not None:
                        raise failed
                    return settled
                calls = it
            pool = self.client.connection_pool
            conn = _get_connection(pool)
            sent = []
            replies = []
            failed = None
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
                    conn.send_packed_command(conn.pack_command(*_args(c, bool(self._fn))), check_health=not sent)
                    sent.append(c)
                for _c in sent:
                    try:
                        replies.append(conn.read_response())
                    except rexc.ResponseError as exc:
                        replies.append(exc)
            except BaseException:
                conn.disconnect()
                raise
            finally:
                pool.release(conn)
            settled = self._settle(sent, replies)
            if failed is not None:
                raise failed
            return settled
        except BOUNDARY_ERRORS as exc:  # the error boundary (see drivers_common)
            raise translate_error(exc) from exc

    def _settle(self, calls: list[Call], replies: list[Any]) -> list[Any]:
        for _ in range(2):  # as in ``_call``: FCALL -> library loaded, or EVALSHA -> SCRIPT LOAD
            missing = [i for i, r in enumerate(replies) if _missing(r)]
            if not missing:
                break
            if self._fn and any(not isinstance(replies[i], rexc.NoScriptError) for i in missing):
                self._library_missing()
            for body in {
                script_.body
                for i in missing
                if (script_ := calls[i].script) and isinstance(replies[i], rexc.NoScriptError)
            }:
                self.client.execute_command("SCRIPT LOAD", body)
            again = self._pipe([calls[i] for i in missing])
            for i, r in zip(missing, again):
                replies[i] = r
        for c, r in zip(calls, replies):
            if isinstance(r, Exception):
                raise self._explain(c, r)
        return replies

    def _pipe(self, calls: Iterable[Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        functions = bool(self._fn)
        for c in calls:
            pipe.execute_command(*_args(c, functions))
        return pipe.execute(raise_on_error=False)

    def run(self, flow: Flow[_R]) -> _R:
        """Drive a core flow to completion (its calls leave redis-py errors translated)."""
        try:
            step = next(flow)
            while True:
                if isinstance(step, list):
                    reply = self.pipeline(step)
                elif isinstance(step, Pause):
                    time.sleep(step.seconds)
                    reply = None
                elif isinstance(step, Stream):
                    reply = self.stream(step.calls)
                else:
                    reply = self.call(step)
                step = flow.send(reply)
        except StopIteration as stop:
            result: _R = stop.value  # the flow's return value
            return result

    def close(self) -> None:
        if self._lane is not None:
            self._lane.close()
        self.client.close()
