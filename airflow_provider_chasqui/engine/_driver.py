"""The asyncio driver: runs core Calls and flows on ``redis.asyncio``.

The only asyncio code that touches Redis for producers, workers and triggers.  Replies are
kept raw (no redis-py reshaping) so the core parses one format; EVALSHA falls back to
SCRIPT LOAD on NOSCRIPT; redis errors become ChasquiError subclasses in one place.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Iterable

import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis._parsers.helpers import parse_command as _parse_command
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from ..core.calls import Call, Flow, Stream
from ..core.urls import split_cluster_flag
from ._sentinel import make_client
from ..core.features import COMPAT, Features, detect_call, fast_paths_default, parse_features
from ..errors import ChasquiConnectionError, ScriptError

__all__ = ["AsyncDriver", "translate_errors"]


try:  # a dependency (redis[hiredis]); without it redis-py's own packer is used
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover
    _hiredis_pack = None

_HIREDIS_CLASSES: dict[type, type] = {}


def _hiredis_connection_class(cls: type) -> type:
    """``cls`` packing commands with hiredis' C packer.

    redis.asyncio packs every argument in Python (several microseconds each), which dominated
    the worker's per-batch script calls; the sync client already uses hiredis.  Same bytes on
    the wire; a command hiredis refuses (or whose name holds a space) takes the original path,
    so its errors are unchanged.
    """
    fast = _HIREDIS_CLASSES.get(cls)
    if fast is None:
        original = cls.pack_command

        def pack_command(self: Any, *args: Any) -> list[bytes]:
            first = args[0] if args else None
            if isinstance(first, (str, bytes)) and (" " if isinstance(first, str) else b" ") not in first:
                try:
                    return [_hiredis_pack(args)]
                except (TypeError, UnicodeError):
                    pass
            return original(self, *args)

        fast = type(f"Hiredis{cls.__name__}", (cls,), {"pack_command": pack_command})
        _HIREDIS_CLASSES[cls] = fast
    return fast


def raw_client(url: str, *, cluster: bool | None = None, **kwargs: Any) -> aioredis.Redis:
    """A client with redis-py's reply reshaping switched off.

    ``?cluster=true`` in the URL (or ``cluster=True``) gives a ``RedisCluster``: every script
    of this project touches one queue's hash tag, so each runs on a single slot.
    """
    url, use_cluster = split_cluster_flag(url, cluster)
    if use_cluster:
        kwargs.pop("single_connection_client", None)  # the cluster client pools per node
        cclient = _RawCluster.from_url(url, decode_responses=False, **kwargs)
        cclient.response_callbacks.clear()  # the nodes share this dict
        cclient.response_callbacks["COMMAND"] = _command_listing_only
        return cclient  # type: ignore[return-value]
    client = make_client(url, decode_responses=False, **kwargs)  # redis+sentinel:// too
    client.response_callbacks.clear()
    pool = client.connection_pool
    if _hiredis_pack is not None and str(pool.connection_kwargs.get("encoding", "utf-8")).lower() in ("utf-8", "utf8") \
            and pool.connection_kwargs.get("encoding_errors", "strict") == "strict":
        pool.connection_class = _hiredis_connection_class(pool.connection_class)
    return client


class _RawCluster(AsyncRedisCluster):
    """Routes two-word commands sent as separate arguments (``"CLIENT", "ID"``) the way the
    sync cluster client does: by their joined name's node flag, not by key lookup."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > 1 and isinstance(args[0], str) and isinstance(args[1], str):
            joined = f"{args[0]} {args[1]}".upper()
            if joined in self.command_flags:
                args = (joined, *args[2:])
        return await super().execute_command(*args, **kwargs)


def _command_listing_only(response: Any, **options: Any) -> Any:
    """The async cluster client parses the full ``COMMAND`` listing (hundreds of entries) at
    start-up to route commands; ``COMMAND INFO <name>`` (one entry) stays raw for the core."""
    if isinstance(response, list) and len(response) > 1:
        return _parse_command(response, **options)
    return response


@contextlib.asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    try:
        yield
    except (rexc.ConnectionError, rexc.TimeoutError) as exc:
        raise ChasquiConnectionError(f"Redis is unreachable: {exc}") from exc
    except rexc.ResponseError as exc:
        raise ScriptError(str(exc)) from exc


def _args(c: Call) -> tuple[Any, ...]:
    return c.args if c.script is None else ("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.argv)


async def _get_connection(pool: Any) -> Any:
    try:
        return await pool.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        return await pool.get_connection("EVALSHA")


CLUSTER = AsyncRedisCluster


class AsyncDriver:
    """One connection pool plus the feature flags of its server.  Task-safe."""

    def __init__(self, url: str = "redis://127.0.0.1:6379", *, client: aioredis.Redis | None = None,
                 fast_paths: bool | None = None, **client_kwargs: Any) -> None:
        self.url = url
        self.client = client if client is not None else raw_client(url, **client_kwargs)
        if client is not None:
            self.client.response_callbacks.clear()
        self._fast_paths = fast_paths_default() if fast_paths is None else fast_paths
        self._features: Features | None = None

    async def features(self) -> Features:
        if self._features is None:
            self._features = parse_features(await self.call(detect_call())) if self._fast_paths else COMPAT
        return self._features

    async def call(self, c: Call) -> Any:
        if c.script is None:
            return await self.client.execute_command(*c.args)
        try:
            return await self.client.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.argv)
        except rexc.NoScriptError:
            await self.client.execute_command("SCRIPT LOAD", c.script.body)
            return await self.client.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.argv)

    async def pipeline(self, calls: list[Call]) -> list[Any]:
        """One round trip; scripts missing from the server are loaded and only they re-run."""
        return await self._settle(calls, await self._pipe(calls))

    async def stream(self, calls: Iterable[Call]) -> list[Any]:
        """Send each call as the iterable produces it, on one connection, then read every reply
        (see ``core.calls.Stream``); a cluster client runs the calls as one pipeline."""
        if isinstance(self.client, CLUSTER):
            return await self.pipeline(list(calls))
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
                await conn.send_packed_command(conn.pack_command(*_args(c)), check_health=not sent)
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

    async def _settle(self, calls: list[Call], replies: list[Any]) -> list[Any]:
        missing = [i for i, r in enumerate(replies) if isinstance(r, rexc.NoScriptError)]
        if missing:
            for body in {calls[i].script.body for i in missing if calls[i].script}:
                await self.client.execute_command("SCRIPT LOAD", body)
            again = await self._pipe([calls[i] for i in missing])
            for i, r in zip(missing, again):
                replies[i] = r
        for r in replies:
            if isinstance(r, Exception):
                raise r
        return replies

    async def _pipe(self, calls: Iterable[Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for c in calls:
            if c.script is None:
                pipe.execute_command(*c.args)
            else:
                pipe.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.argv)
        return await pipe.execute(raise_on_error=False)

    async def run(self, flow: Flow) -> Any:
        """Drive a core flow to completion, translating redis errors (as ``translate_errors``,
        inlined: an async context manager per call costs more than a one-by-one add's encoding)."""
        try:
            step = next(flow)
            while True:
                if isinstance(step, list):
                    reply = await self.pipeline(step)
                elif isinstance(step, Stream):
                    reply = await self.stream(step.calls)
                else:
                    reply = await self.call(step)
                step = flow.send(reply)
        except StopIteration as stop:
            return stop.value
        except (rexc.ConnectionError, rexc.TimeoutError) as exc:
            raise ChasquiConnectionError(f"Redis is unreachable: {exc}") from exc
        except rexc.ResponseError as exc:
            raise ScriptError(str(exc)) from exc

    async def close(self) -> None:
        await self.client.aclose()
