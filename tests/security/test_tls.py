"""TLS: ``rediss://`` to a loopback redis-server with a certificate the test makes.

The server listens on a TLS port only (its plain port is closed with ``CONFIG SET port 0``
once it is up), so every byte the producer, the worker and the events reader exchange is
encrypted.  The CA is passed through the URL (``?ssl_ca_certs=``); hostname checking stays
on.  Negative cases: an unknown CA, a hostname the certificate does not name, plain
``redis://`` and, with mutual TLS, a client without a certificate all fail to connect.
Redis 7 (Debian's build) is the only test server with TLS compiled in.
"""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import pytest
import redis
from engine_support import running, wait_until
from fault_support import make_tls_files
from servers import free_port, start_server

from airflow_provider_chasqui import Queue, QueueEvents, SyncQueue, Worker
from airflow_provider_chasqui.engine.sharded import ShardedQueue
from airflow_provider_chasqui.errors import ChasquiConnectionError, ConfigError
from airflow_provider_chasqui.hooks._connection import ChasquiConnectionSettings
from airflow_provider_chasqui.sync.sharded import SyncShardedQueue


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_tls_files(tmp_path_factory.mktemp("tls"))


@pytest.fixture(params=[False, True], ids=["server-auth", "mutual-tls"])
def tls_server(request, tmp_path, tls_files):
    files = tls_files
    port = free_port()
    mutual = request.param
    server = start_server(
        "redis7",
        tmpdir=tmp_path,
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
            "yes" if mutual else "no",
        ),
    )
    try:
        with server.client() as plain:
            plain.config_set("port", 0)  # from here on the server speaks TLS only
        yield server, port, files, mutual
    finally:
        server.stop()


def _url(port: int, files, mutual: bool, *, ca=None, host: str = "127.0.0.1", scheme: str = "rediss") -> str:
    query = f"ssl_ca_certs={quote(str(ca or files.ca))}"
    if mutual:
        query += f"&ssl_certfile={quote(str(files.client_cert))}&ssl_keyfile={quote(str(files.client_key))}"
    return f"{scheme}://{host}:{port}/0?{query}"


@pytest.mark.timeout(120)
async def test_producer_worker_and_events_over_tls(tls_server) -> None:
    server, port, files, mutual = tls_server
    url = _url(port, files, mutual)
    ran: set[int] = set()

    async def handler(job) -> int:
        ran.add(job.data["i"])
        return job.data["i"]

    async with Queue("tls-q", redis_url=url) as q:
        await q.add_bulk([{"name": "t", "data": {"i": i}} for i in range(200)])
        delayed = await q.add("t", {"i": 200}, delay_ms=20)
        events = QueueEvents("tls-q", redis_url=url, last_event_id="0-0", block_ms=200)
        # tls=True upgrades a redis:// URL, as chasquimq's flag does.
        worker = Worker(
            "tls-q",
            handler,
            redis_url=_url(port, files, mutual, scheme="redis"),
            tls=True,
            store_results=True,
            run_scheduler=False,
            promoter_poll_ms=20,
        )
        async with running(worker):
            await wait_until(lambda: len(ran) == 201, 30, what="every job over TLS")
            assert await q.wait_for_result(delayed.id, timeout=10) == 200
            async for ev in events:
                if ev.name == "completed":
                    break
        await events.close()
    with SyncQueue("tls-q", redis_url=url) as sq:
        assert sq.get_job_state(delayed.id) == "completed"
    with redis.Redis.from_url(url) as admin:  # the plain port really is closed
        assert admin.config_get("port") == {"port": "0"}
        assert int(admin.info("stats")["total_connections_received"]) > 0


@pytest.mark.timeout(120)
async def test_tls_refuses_wrong_ca_wrong_host_and_plaintext(tls_server) -> None:
    server, port, files, mutual = tls_server
    bad = {
        "unknown CA": _url(port, files, mutual, ca=files.other_ca),
        "hostname not in the certificate": _url(port, files, mutual, host="localhost"),
        "plain redis:// to the TLS port": f"redis://127.0.0.1:{port}/0?socket_timeout=5",
    }
    if mutual:
        bad["no client certificate"] = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={quote(str(files.ca))}"
    for url in bad.values():
        async with Queue("tls-q", redis_url=url) as q:
            with pytest.raises(ChasquiConnectionError):
                await asyncio.wait_for(q.add("t", {}), 20)
        with SyncQueue("tls-q", redis_url=url) as sq, pytest.raises(ChasquiConnectionError):
            sq.add("t", {})


def _verify_options(client) -> dict:
    kw = client.connection_pool.connection_kwargs
    return {"ssl_cert_reqs": kw.get("ssl_cert_reqs"), "ssl_check_hostname": kw.get("ssl_check_hostname")}


@pytest.mark.timeout(120)
async def test_verification_is_explicit_on_every_client_and_a_wrong_hostname_is_refused(tls_server) -> None:
    """Certificate and hostname checks are set by the package, not left to redis-py's default
    (redis-py 5 does not check the hostname unless told): on the producer, its blocking twin,
    the events reader and the worker, and on the URL the Airflow connection builds."""
    server, port, files, mutual = tls_server
    url = _url(port, files, mutual)
    want = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    q, sq = Queue("tls-v", redis_url=url), SyncQueue("tls-v", redis_url=url)
    events = QueueEvents("tls-v", redis_url=url)
    worker = Worker("tls-v", lambda job: None, redis_url=url, run_scheduler=False)
    try:
        assert _verify_options(q.driver.client) == want
        assert _verify_options(sq.driver.client) == want
        assert _verify_options(events._driver.client) == want
        job = await q.add("v", {})
        assert sq.get_job_state(job.id) == "waiting"
        async with running(worker):
            await wait_until(lambda: getattr(worker, "_intake", None) is not None, 20, what="the worker's clients")
            assert _verify_options(worker.driver.client) == want
            assert _verify_options(worker._intake.reader) == want
    finally:
        await q.close()
        sq.close()
        await events.close()
    # the Airflow connection's URL (hooks/_connection.py): host "localhost" is not in the certificate
    extra = {"tls": True, "tls_ca_certs": str(files.ca)}
    for host, ok in (("127.0.0.1", True), ("localhost", False)):
        conn = ChasquiConnectionSettings.from_fields(
            host=host, port=port, login=None, password=None, schema=None, extra=extra
        )
        conn_url = conn.redis_url()
        if mutual:
            conn_url += f"&ssl_certfile={quote(str(files.client_cert))}&ssl_keyfile={quote(str(files.client_key))}"
        with SyncQueue("tls-v", redis_url=conn_url) as hq:
            assert _verify_options(hq.driver.client) == want
            if ok:
                hq.add("v", {})
            else:
                with pytest.raises(ChasquiConnectionError, match="(?i)hostname|match|certificate"):
                    hq.add("v", {})
    # verification off is the URL's explicit choice, and then it connects without a CA
    off = f"rediss://localhost:{port}/0?ssl_cert_reqs=none"
    if mutual:
        off += f"&ssl_certfile={quote(str(files.client_cert))}&ssl_keyfile={quote(str(files.client_key))}"
    with SyncQueue("tls-v", redis_url=off) as oq:
        oq.add("v", {})
        assert oq.driver.client.connection_pool.connection_kwargs["ssl_check_hostname"] is False


async def test_tls_flag_never_silently_does_nothing(tmp_path) -> None:
    """``tls=True`` upgrades redis:// and redis+sentinel:// (TLS to the master, verified); a unix
    socket cannot be upgraded and is refused instead of connecting in plain text."""
    sock = f"unix://{tmp_path}/redis.sock"
    for make in (
        lambda: Queue("t", redis_url=sock, tls=True),
        lambda: SyncQueue("t", redis_url=sock, tls=True),
        lambda: Worker("t", lambda job: None, redis_url=sock, tls=True),
        lambda: ShardedQueue("t", 2, redis_url=sock, tls=True),
        lambda: SyncShardedQueue("t", 2, redis_url=sock, tls=True),
    ):
        with pytest.raises(ConfigError, match="unix"):
            make()
    with pytest.raises(ConfigError, match="tls must be a bool"):
        Queue("t", redis_url="redis://127.0.0.1:6379", tls="yes")
    sentinel_url = "redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc/0"
    aq, sq = Queue("t", redis_url=sentinel_url, tls=True), SyncQueue("t", redis_url=sentinel_url, tls=True)
    try:
        for pool in (aq.driver.client.connection_pool, sq.driver.client.connection_pool):
            assert "SSL" in pool.connection_class.__name__
            assert pool.connection_kwargs["ssl_cert_reqs"] == "required"
            assert pool.connection_kwargs["ssl_check_hostname"] is True
    finally:
        await aq.close()
        sq.close()


@pytest.mark.timeout(60)
def test_a_bare_endpoint_with_tls_is_rediss_and_without_it_a_clear_error(tls_server, monkeypatch) -> None:
    """chasquimq's ``apply_tls``: with ``tls=True`` a bare ``host:port`` (an endpoint as a cloud
    console shows it) is ``rediss://host:port``, verified against the system's trust store
    (here ``SSL_CERT_FILE`` holds the test CA); a server asking for a client certificate
    refuses it.  Without ``tls`` the bare endpoint is a ConfigError saying to add a scheme."""
    server, port, files, mutual = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", str(files.ca))
    with SyncQueue("tls-bare", redis_url=f"127.0.0.1:{port}", tls=True) as q:
        assert q.driver.client.connection_pool.connection_kwargs["ssl_cert_reqs"] == "required"
        if mutual:
            with pytest.raises(ChasquiConnectionError):
                q.add("t", {"i": 1})
        else:
            job = q.add("t", {"i": 1})
            assert q.get_job_state(job.id) == "waiting"
    for bare in (f"127.0.0.1:{port}", "my-cluster.cache.amazonaws.com:6379", "[::1]:6380"):
        with pytest.raises(ConfigError, match="has no scheme: write redis://"):
            SyncQueue("tls-bare", redis_url=bare)
