"""Shared fixtures: real servers only, and no test ever flushes a server others share.

* ``redis_url``   -- the shared Redis (REDIS_URL, default redis://127.0.0.1:6379/0)
* ``queue_name``  -- a fresh queue name per test; its ``{chasqui:<name>}*`` keys are deleted after
* ``server_matrix`` / ``compat_mode`` / ``matrix_url`` -- run a test on Redis 7.0, Valkey 8.1 and
  Redis 8.2, each once with server fast paths forced off and once with auto detection
* ``cluster_server`` -- a three-master Redis Cluster on loopback, started once per session on first
  use (``tests/engine`` runs its tests on it too, see tests/engine/conftest.py)

Deliberately free of airflow and pyspark imports: the core suite must not pay for them.
"""

from __future__ import annotations

import gc
import os
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

# servers.py sits beside this file; make it importable whatever pytest's import mode is.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from fault_support import make_tls_files  # noqa: E402
from servers import (  # noqa: E402
    CLUSTER_KIND,
    KINDS,
    Cluster,
    RunningServer,
    attach_server,
    free_port,
    start_cluster,
    start_server,
)

from airflow_provider_chasqui.core.keys import QueueKeys  # noqa: E402
from airflow_provider_chasqui.core.urls import split_cluster_flag  # noqa: E402

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


@dataclass(frozen=True)
class MatrixTarget:
    """Where a matrix test runs: ``force_compat`` means "use no server fast path"."""

    url: str
    kind: str
    force_compat: bool
    version: str


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "single_node(reason): runs on the single shared server only, never on the test cluster"
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything imported by collection is frozen out of the collector, so the per-test
    collection below only walks what tests made since (about 1 ms instead of 100)."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _leaks_fail_the_test_that_leaked() -> Iterator[None]:
    """An unclosed client, socket or cluster node is collected at the end of the test that left
    it (its ``ResourceWarning`` is an error, pyproject's ``filterwarnings``), not at some later
    test's random garbage collection (issue 29).  Set up first, so torn down last: after the
    test's own fixtures have closed what they opened."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def shared_redis_url() -> str:
    """URL of the shared server; checked once so a missing server is one clear error."""
    url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=5) as r:
            r.ping()
    except redis.RedisError as exc:
        pytest.fail(f"no Redis at {url} ({exc}); start one (see .ci/run) or set REDIS_URL", pytrace=False)
    return url


@pytest.fixture(scope="session")
def redis_url(shared_redis_url: str) -> str:
    """The server a test runs on: the shared one (tests/engine also gives it the cluster's URL)."""
    return shared_redis_url


@pytest.fixture(scope="session")
def chasquimq():
    """The real chasquimq package, for the tests marked ``interop``: imported here, not at module level, so the
    main venv (which has no chasquimq: its redis<7 cap would bind everything) collects and deselects them."""
    try:
        import chasquimq as module
    except ImportError as exc:
        pytest.fail(
            f"interop tests need chasquimq ({exc}): pip install '.[interop]', or run scripts/matrix.sh interop",
            pytrace=False,
        )
    return module


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _delete_queue_keys(url: str, queue: str) -> None:
    prefix = QueueKeys.for_queue(queue).prefix
    pattern = _glob_escape(prefix) + "*"
    url, cluster = split_cluster_flag(url)
    if cluster:  # every key of a queue shares its hash tag, so one node holds them all
        with redis.RedisCluster.from_url(url, socket_timeout=10) as rc:
            node = rc.get_node_from_key(prefix)
        # a client of its own: the cluster's close() leaves the node client get_redis_connection()
        # hands out open, and its socket leaked into a later test's collection (issue 29)
        with redis.Redis(host=node.host, port=node.port, socket_timeout=10) as r:
            _unlink_matching(r, pattern)
        return
    with redis.Redis.from_url(url, socket_timeout=10) as r:
        _unlink_matching(r, pattern)


def _unlink_matching(r: redis.Redis, pattern: str) -> None:
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
    if "cluster_server" in request.fixturenames:
        urls.append(request.getfixturevalue("cluster_server").url)
    if "redis_url" in request.fixturenames or not urls:
        urls.append(request.getfixturevalue("redis_url"))
    name = f"t-{uuid.uuid4().hex[:8]}"
    yield name
    for url in dict.fromkeys(urls):
        _delete_queue_keys(url, name)


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A Redis 7 of the requesting module alone: its tests kill connections and flush scripts."""
    server = start_server("redis7", tmpdir=tmp_path_factory.mktemp("own"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def own_url(own_server: RunningServer, queue_name: str) -> Iterator[str]:
    """``own_server``'s URL; the queue's keys go from it afterwards (``queue_name`` cleans the shared one)."""
    yield own_server.url
    _delete_queue_keys(own_server.url, queue_name)


@pytest.fixture(scope="module")
def tls_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A TLS-only Redis (its plain port closed once up) and a ``rediss://`` URL trusting its CA."""
    d = tmp_path_factory.mktemp("tls")
    files = make_tls_files(d)
    port = free_port()
    server = start_server(
        "redis7",
        tmpdir=d,
        extra_args=(
            "--tls-port",
            str(port),
            "--tls-cert-file",
            str(files.cert),
            "--tls-key-file",
            str(files.key),
            "--tls-ca-cert-file",
            str(files.ca),
            "--tls-auth-clients",
            "no",
        ),
    )
    try:
        with server.client() as plain:
            plain.config_set("port", 0)
        yield f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={quote(str(files.ca))}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _server_pool(
    shared_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], RunningServer | Cluster]]:
    """Each matrix server (and the cluster) started at most once per session, all stopped at its end."""
    servers: dict[str, RunningServer | Cluster] = {}

    def get(kind: str) -> RunningServer | Cluster:
        if kind not in servers:
            if kind == CLUSTER_KIND:
                servers[kind] = start_cluster(tmpdir=tmp_path_factory.mktemp("cluster"))
                return servers[kind]
            if kind == "redis7":
                shared = attach_server(shared_redis_url, "redis7")
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
def server_matrix(request: pytest.FixtureRequest, _server_pool: Callable[[str], RunningServer]) -> RunningServer:
    """One of redis7 (the shared 6379 when it is 7.x), valkey8, redis82; never stop it."""
    return _server_pool(request.param)


@pytest.fixture(scope="session")
def cluster_server(_server_pool: Callable[[str], RunningServer | Cluster]) -> Cluster:
    """Three redis7 masters joined as a cluster (``.url`` has ``?cluster=true``); never stop it."""
    return _server_pool(CLUSTER_KIND)


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
