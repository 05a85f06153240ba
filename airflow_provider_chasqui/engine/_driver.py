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

from ..core.calls import Call, Flow
from ..core.features import COMPAT, Features, detect_call, fast_paths_default, parse_features
from ..errors import ChasquiConnectionError, ScriptError

__all__ = ["AsyncDriver", "translate_errors"]


def raw_client(url: str, **kwargs: Any) -> aioredis.Redis:
    client = aioredis.Redis.from_url(url, decode_responses=False, **kwargs)
    client.response_callbacks.clear()
    return client


@contextlib.asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    try:
        yield
    except (rexc.ConnectionError, rexc.TimeoutError) as exc:
        raise ChasquiConnectionError(f"Redis is unreachable: {exc}") from exc
    except rexc.ResponseError as exc:
        raise ScriptError(str(exc)) from exc


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
            await self.client.execute_command("SCRIPT", "LOAD", c.script.body)
            return await self.client.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.argv)

    async def pipeline(self, calls: list[Call]) -> list[Any]:
        """One round trip; scripts missing from the server are loaded and only they re-run."""
        replies = await self._pipe(calls)
        missing = [i for i, r in enumerate(replies) if isinstance(r, rexc.NoScriptError)]
        if missing:
            for body in {calls[i].script.body for i in missing if calls[i].script}:
                await self.client.execute_command("SCRIPT", "LOAD", body)
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
        """Drive a core flow to completion, translating redis errors."""
        async with translate_errors():
            try:
                step = next(flow)
                while True:
                    reply = await (self.pipeline(step) if isinstance(step, list) else self.call(step))
                    step = flow.send(reply)
            except StopIteration as stop:
                return stop.value

    async def close(self) -> None:
        await self.client.aclose()
