"""Fixtures of the engine suite: clients, queues and workers that are always closed.

Every engine test taking ``redis_url`` runs twice: on the shared single server and on a
three-master Redis Cluster (``cluster_server``, started once per session), where each queue's
keys share one hash slot.  ``@pytest.mark.single_node("why")`` keeps a test off the cluster;
``server_matrix`` here adds the cluster to the server matrix.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from engine_support import raw_async
from servers import CLUSTER_KIND, KINDS, Cluster, RunningServer

from airflow_provider_chasqui import Queue, Worker

SINGLE = "single"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each ``redis_url`` test on the single server and on the cluster."""
    if "redis_url" in metafunc.fixturenames and metafunc.definition.get_closest_marker("single_node") is None:
        metafunc.parametrize("redis_url", [SINGLE, CLUSTER_KIND], indirect=True, scope="session")


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest, shared_redis_url: str) -> str:
    """The shared server's URL, or the cluster's (``...?cluster=true``) for the cluster param."""
    if getattr(request, "param", SINGLE) == CLUSTER_KIND:
        return request.getfixturevalue("cluster_server").url
    return shared_redis_url


@pytest.fixture(scope="session", params=(*KINDS, CLUSTER_KIND))
def server_matrix(
    request: pytest.FixtureRequest, _server_pool: Callable[[str], RunningServer | Cluster]
) -> RunningServer | Cluster:
    """The root matrix plus the cluster (redis7 masters): the worker's core paths on each."""
    return _server_pool(request.param)


def _crossslot_errors(cluster: Cluster) -> int:
    """CROSSSLOT replies the cluster's nodes have sent so far (INFO errorstats)."""
    total = 0
    for node in cluster.nodes:
        with node.client(socket_timeout=5) as r:
            total += int(r.info("errorstats").get("errorstat_CROSSSLOT", {}).get("count", 0))
    return total


@pytest.fixture(autouse=True)
def _no_crossslot_on_the_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test on the cluster fails if any node answered CROSSSLOT meanwhile, even to a
    background call whose error the worker only logged."""
    params = getattr(request.node, "callspec", None)
    params = params.params if params is not None else {}
    if CLUSTER_KIND not in (params.get("redis_url"), params.get("server_matrix")):
        yield
        return
    cluster = request.getfixturevalue("cluster_server")
    before = _crossslot_errors(cluster)
    yield
    assert _crossslot_errors(cluster) == before, "a node of the cluster answered CROSSSLOT"


@pytest.fixture
async def clients() -> AsyncIterator[Callable[[str], aioredis.Redis]]:
    """``clients(url)``: a raw asyncio client for inspecting a server (closed afterwards)."""
    made: list[aioredis.Redis] = []

    def make(url: str) -> aioredis.Redis:
        c = raw_async(url)
        made.append(c)
        return c

    yield make
    for c in made:
        await c.aclose()


@pytest.fixture
async def queues() -> AsyncIterator[Callable[..., Queue]]:
    """``queues(name, url, **kw)``: a producer closed at teardown."""
    made: list[Queue] = []

    def make(name: str, url: str, **kwargs: Any) -> Queue:
        q = Queue(name, redis_url=url, **kwargs)
        made.append(q)
        return q

    yield make
    for q in made:
        await q.close()


def make_worker(name: str, handler: Any, url: str, **kwargs: Any) -> Worker:
    """A worker with test-friendly defaults (no embedded cron scheduler unless asked)."""
    kwargs.setdefault("run_scheduler", False)
    kwargs.setdefault("read_block_ms", 1000)
    return Worker(name, handler, redis_url=url, **kwargs)


@pytest.fixture
def worker_factory() -> Callable[..., Worker]:
    return make_worker
