"""``credential_provider=`` (chasquimq's, ``credentials.py``) against a private Redis 7 that
requires AUTH: every client of a Queue, SyncQueue, QueueEvents and Worker (its reader, lease
guard, promoter and scheduler) authenticates with tokens the provider fetches per connection; a
rotated token reaches new connections; a provider that raises, answers in the wrong shape or
hangs is a connection error naming it; bad arguments are refused at construction."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from engine_support import running, wait_until
from servers import start_auth_server

from airflow_provider_chasqui import ConfigError, Job, Queue, QueueEvents, RepeatPattern, SyncQueue, Worker, credentials
from airflow_provider_chasqui.errors import ChasquiConnectionError, ConfigTypeError

pytestmark = [pytest.mark.timeout(120), pytest.mark.single_node("a private server that requires AUTH")]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    s = start_auth_server(tmp_path_factory.mktemp("auth"))  # user "chasqui", password "tok-1"
    try:
        yield s
    finally:
        s.stop()


def _admin(server: Any) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, password=server.admin_password, protocol=2)


class Tokens:
    """An ``async def`` provider whose token the test rotates; it notes each endpoint asked."""

    def __init__(self, token: str = "tok-1") -> None:
        self.token, self.asked = token, []

    async def __call__(self, endpoint: str | None) -> tuple[str | None, str | None]:
        self.asked.append(endpoint)
        await asyncio.sleep(0)
        return "chasqui", self.token


async def test_every_client_authenticates_with_the_providers_tokens(server: Any) -> None:
    """Producer, events reader and worker (reader, lease guard, promoter, scheduler) on a server
    that refuses unauthenticated clients: jobs, a delayed job and a repeatable spec run."""
    url, name = server.url, "cred-" + uuid.uuid4().hex[:8]
    with pytest.raises(ChasquiConnectionError, match="Authentication required|NOAUTH|invalid"):
        # another URL (database 1): a provider is registered per URL string, for the process
        async with Queue(name + "-x", redis_url=url.replace("/0", "/1")) as plain:
            await plain.add("t", {})
    tokens = Tokens()
    done: list[int] = []

    async def handler(job: Job) -> int:
        done.append(job.data["i"])
        return job.data["i"]

    async with Queue(name, redis_url=url, credential_provider=tokens) as q:
        events = QueueEvents(name, redis_url=url, last_event_id="0-0", block_ms=200, credential_provider=tokens)
        await q.add_bulk([{"name": "t", "data": {"i": i}} for i in range(50)])
        later = await q.add("t", {"i": 50}, delay_ms=50)
        await q.upsert_repeatable_job("tick", {"i": 51}, repeat=RepeatPattern.every(200))
        w = Worker(
            name,
            handler,
            redis_url=url,
            credential_provider=tokens,
            store_results=True,
            claim_min_idle_ms=600,
            read_block_ms=200,
            promoter_poll_ms=20,
            scheduler_tick_ms=100,
        )
        async with running(w):
            await wait_until(lambda: set(range(52)) <= set(done), 30, what="jobs, the delayed one and a fire")
            assert await q.wait_for_result(later.id, timeout=10) == 50
            async for ev in events:
                if ev.name == "completed":
                    break
            with _admin(server) as admin:  # the worker's connections are the provider's user's
                users = [
                    f.split(b"=")[1]
                    for line in admin.execute_command("CLIENT", "LIST").split(b"\n")
                    for f in line.split()
                    if f.startswith(b"user=")
                ]
            assert users.count(b"chasqui") >= 3 and set(users) == {b"chasqui", b"default"}, users
        await events.close()
    assert set(tokens.asked) == {f"127.0.0.1:{server.port}"}


def test_a_rotated_token_reaches_new_connections_and_a_sync_provider_works(server: Any) -> None:
    url, name = server.url, "cred-" + uuid.uuid4().hex[:8]
    tokens = Tokens()
    with SyncQueue(name, redis_url=url, credential_provider=tokens) as q:
        q.add("t", {"i": 1})
    with _admin(server) as admin:
        admin.execute_command("ACL", "SETUSER", "chasqui", "resetpass", ">tok-2")
    with (
        pytest.raises(ChasquiConnectionError, match="WRONGPASS|invalid"),
        SyncQueue(name, redis_url=url, credential_provider=tokens) as q,  # still hands out tok-1
    ):
        q.add("t", {"i": 2})
    tokens.token = "tok-2"
    with SyncQueue(name, redis_url=url, credential_provider=tokens) as q:
        assert q.add("t", {"i": 3}).data == {"i": 3}
    with SyncQueue(name, redis_url=url, credential_provider=lambda endpoint: ("chasqui", "tok-2")) as q:
        assert q.get_job_counts("waiting") == {"waiting": 2}
    with _admin(server) as admin:
        admin.execute_command("ACL", "SETUSER", "chasqui", "resetpass", ">tok-1")


async def _bad(endpoint: str | None) -> Any:
    raise RuntimeError("simulated IAM token fetch failure")


async def _wrong_shape(endpoint: str | None) -> Any:
    return "not-a-tuple"


async def _user_only(endpoint: str | None) -> Any:
    return ("chasqui", None)


@pytest.mark.parametrize(
    ("provider", "says"),
    [
        (_bad, r"credential_provider failed: RuntimeError\('simulated IAM token fetch failure'\)"),
        (_wrong_shape, r"credential_provider must return \(username, password\)"),
        (_user_only, "a username without a password"),
    ],
    ids=["raises", "wrong-shape", "user-only"],
)
async def test_a_failing_provider_is_a_connection_error_naming_it(server: Any, provider: Any, says: str) -> None:
    async with Queue("cred-bad", redis_url=server.url, credential_provider=provider) as q:
        with pytest.raises(ChasquiConnectionError, match=says):
            await q.add("t", {})
    with (
        SyncQueue("cred-bad", redis_url=server.url, credential_provider=provider) as sq,
        pytest.raises(ChasquiConnectionError, match=says),
    ):
        sq.add("t", {})


def test_bad_provider_arguments_are_refused_at_construction(server: Any) -> None:
    for auth in (":pw@", "alice@", "alice:pw@"):
        with pytest.raises(ConfigError, match="credential_provider and a user or password in the Redis URL"):
            SyncQueue("cred", redis_url=f"redis://{auth}127.0.0.1:{server.port}/0", credential_provider=Tokens())
    for bad in ("token", 5, {"user": "x"}):
        with pytest.raises(ConfigTypeError, match="credential_provider must be an async function"):
            Queue("cred", redis_url=server.url, credential_provider=bad)
        with pytest.raises(ConfigTypeError, match="credential_provider must be"):
            Worker("cred", lambda job: None, redis_url=server.url, credential_provider=bad)


def test_chasqui_worker_takes_a_credential_provider(server: Any, tmp_path: Any) -> None:
    """``chasqui worker --credential-provider pkg.module:attr`` runs jobs on the server that
    requires AUTH; a spec that names nothing is a usage error (exit 2) naming the flag."""
    (tmp_path / "credmod.py").write_text(
        "async def provider(endpoint):\n    return 'chasqui', 'tok-1'\n\ndef echo(job):\n    return job.data\n"
    )
    name = "cred-cli-" + uuid.uuid4().hex[:8]
    with SyncQueue(name, redis_url=server.url, credential_provider=Tokens()) as q:
        jobs = q.add_bulk([{"name": "echo", "data": i} for i in range(3)])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
        base = [sys.executable, "-m", "airflow_provider_chasqui.cli", "worker", "--queue", name, "--handlers"]
        base += ["credmod:echo", "--redis-url", server.url, "--max-jobs", "3", "--no-scheduler"]
        done = subprocess.run(
            [*base, "--credential-provider", "credmod:provider"], env=env, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert [q.get_job_result(j.id) for j in jobs] == [0, 1, 2]
    bad = subprocess.run([*base, "--credential-provider", "credmod:nothing"], env=env, capture_output=True, timeout=60)
    assert bad.returncode == 2 and b"--credential-provider 'credmod:nothing'" in bad.stderr, bad.stderr[-2000:]


async def test_a_provider_that_hangs_fails_the_connection_after_its_timeout(server: Any, monkeypatch: Any) -> None:
    """A provider that never answers fails the connection once ``PROVIDER_TIMEOUT_SECS`` passed
    (30 s; shortened here), on the asyncio and the sync clients alike."""
    monkeypatch.setattr(credentials, "PROVIDER_TIMEOUT_SECS", 0.3)

    async def hangs(endpoint: str | None) -> Any:
        await asyncio.sleep(60)

    async with Queue("cred-hang", redis_url=server.url, credential_provider=hangs) as q:
        with pytest.raises(ChasquiConnectionError, match="credential_provider failed: TimeoutError"):
            await asyncio.wait_for(q.add("t", {}), 10)
    with (
        SyncQueue("cred-hang", redis_url=server.url, credential_provider=hangs) as sq,
        pytest.raises(ChasquiConnectionError, match="credential_provider failed: TimeoutError"),
    ):
        sq.add("t", {})
