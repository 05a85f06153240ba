"""Shared fixtures: real servers only, and no test ever flushes a server others share.

* ``redis_url``   -- the shared Redis (REDIS_URL, default redis://127.0.0.1:6379/0)
* ``queue_name``  -- a fresh queue name per test; its ``{chasqui:<name>}*`` keys are deleted after
* ``server_matrix`` / ``compat_mode`` / ``matrix_url`` -- run a test on Redis 7.0, Valkey 8.1 and
  Redis 8.2, each once with server fast paths forced off and once with auto detection

Deliberately free of airflow and pyspark imports: the core suite must not pay for them.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

# servers.py sits beside this file; make it importable whatever pytest's import mode is.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from airflow_provider_chasqui.core.keys import QueueKeys  # noqa: E402
from servers import KINDS, RunningServer, attach_server, start_server  # noqa: E402

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class MatrixTarget:
    """Where a matrix test runs: ``force_compat`` means "use no server fast path"."""

    url: str
    kind: str
    force_compat: bool
    version: str


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the shared server; checked once so a missing server is one clear error."""
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5) as r:
            r.ping()
    except redis.RedisError as exc:
        pytest.fail(f"no Redis at {url} ({exc}); start one (see .ci/run) or set REDIS_URL", pytrace=False)
    return url


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _delete_queue_keys(url: str, queue: str) -> None:
    pattern = _glob_escape(QueueKeys.for_queue(queue).prefix) + "*"
    with redis.Redis.from_url(url, socket_timeout=10) as r:
        batch: list[bytes] = []
        for key in r.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 500:
                r.unlink(*batch)
                batch.clear()
        if batch:
            r.unlink(*batch)


@pytest.fixture
def queue_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """``t-<uuid8>``; afterwards its keys go from the server(s) the test used (SCAN, no FLUSHALL)."""
    # Resolved now, not in teardown, so these fixtures outlive this one.
    urls = []
    if "matrix_url" in request.fixturenames:
        urls.append(request.getfixturevalue("matrix_url").url)
    if "redis_url" in request.fixturenames or not urls:
        urls.append(request.getfixturevalue("redis_url"))
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    for url in dict.fromkeys(urls):
        _delete_queue_keys(url, name)


@pytest.fixture(scope="session")
def _server_pool(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], RunningServer]]:
    """Each matrix server started at most once per session, all stopped at its end."""
    servers: dict[str, RunningServer] = {}

    def get(kind: str) -> RunningServer:
        if kind not in servers:
            if kind == "redis7":
                shared = attach_server(redis_url, "redis7")
                if shared.version.startswith("7."):
                    servers[kind] = shared
                    return shared
            servers[kind] = start_server(kind, tmpdir=tmp_path_factory.mktemp(f"matrix-{kind}"))
        return servers[kind]

    yield get
    for server in servers.values():
        if server.owned:
            server.stop()


@pytest.fixture(scope="session", params=KINDS)
def server_matrix(
    request: pytest.FixtureRequest, _server_pool: Callable[[str], RunningServer]
) -> RunningServer:
    """One of redis7 (the shared 6379 when it is 7.x), valkey8, redis82; never stop it."""
    return _server_pool(request.param)


@pytest.fixture(params=[True, False], ids=["compat", "auto"])
def compat_mode(request: pytest.FixtureRequest) -> bool:
    """True: fast paths (e.g. XACKDEL) forced off; False: detected from the server."""
    return request.param


@pytest.fixture
def matrix_url(server_matrix: RunningServer, compat_mode: bool) -> MatrixTarget:
    """The server and mode one matrix test runs with (6 combinations)."""
    return MatrixTarget(
        url=server_matrix.url,
        kind=server_matrix.kind,
        force_compat=compat_mode,
        version=server_matrix.version,
    )
