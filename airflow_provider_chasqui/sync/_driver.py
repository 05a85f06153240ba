"""The blocking driver: the synchronous twin of ``engine/_driver.py`` (same method names).

Used by Airflow hooks and operators, which run in threads without an event loop.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import redis
from redis import exceptions as rexc

from ..core.calls import Call, Flow
from ..core.features import COMPAT, Features, detect_call, fast_paths_default, parse_features
from ..errors import ChasquiConnectionError, ScriptError

__all__ = ["SyncDriver", "translate_errors"]


def raw_client(url: str, **kwargs: Any) -> redis.Redis:
    client = redis.Redis.from_url(url, decode_responses=False, **kwargs)
    client.response_callbacks.clear()
    return client


@contextlib.contextmanager
def translate_errors() -> Iterator[None]:
    try:
        yield
    except (rexc.ConnectionError, rexc.TimeoutError) as exc:
        raise ChasquiConnectionError(f"Redis is unreachable: {exc}") from exc
    except rexc.ResponseError as exc:
        raise ScriptError(str(exc)) from exc


class SyncDriver:
    """One connection pool plus the feature flags of its server.  Thread-safe."""

    def __init__(self, url: str = "redis://127.0.0.1:6379", *, client: redis.Redis | None = None,
                 fast_paths: bool | None = None, **client_kwargs: Any) -> None:
        self.url = url
        self.client = client if client is not None else raw_client(url, **client_kwargs)
        if client is not None:
            self.client.response_callbacks.clear()
        self._fast_paths = fast_paths_default() if fast_paths is None else fast_paths
        self._features: Features | None = None

    def features(self) -> Features:
        if self._features is None:
            self._features = parse_features(self.call(detect_call())) if self._fast_paths else COMPAT
        return self._features

    def call(self, c: Call) -> Any:
        if c.script is None:
            return self.client.execute_command(*c.args)
        try:
            return self.client.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.argv)
        except rexc.NoScriptError:
            self.client.execute_command("SCRIPT", "LOAD", c.script.body)
            return self.client.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.argv)

    def pipeline(self, calls: list[Call]) -> list[Any]:
        """One round trip; scripts missing from the server are loaded and only they re-run."""
        replies = self._pipe(calls)
        missing = [i for i, r in enumerate(replies) if isinstance(r, rexc.NoScriptError)]
        if missing:
            for body in {calls[i].script.body for i in missing if calls[i].script}:
                self.client.execute_command("SCRIPT", "LOAD", body)
            again = self._pipe([calls[i] for i in missing])
            for i, r in zip(missing, again):
                replies[i] = r
        for r in replies:
            if isinstance(r, Exception):
                raise r
        return replies

    def _pipe(self, calls: Iterable[Call]) -> list[Any]:
        pipe = self.client.pipeline(transaction=False)
        for c in calls:
            if c.script is None:
                pipe.execute_command(*c.args)
            else:
                pipe.execute_command("EVALSHA", c.script.sha, len(c.keys), *c.keys, *c.argv)
        return pipe.execute(raise_on_error=False)

    def run(self, flow: Flow) -> Any:
        """Drive a core flow to completion, translating redis errors."""
        with translate_errors():
            try:
                step = next(flow)
                while True:
                    reply = self.pipeline(step) if isinstance(step, list) else self.call(step)
                    step = flow.send(reply)
            except StopIteration as stop:
                return stop.value

    def close(self) -> None:
        self.client.close()
