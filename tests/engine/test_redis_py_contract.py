"""The redis-py internals the package touches, each asserted with the shape we use (issue #17).

The lanes (``engine/_wire.py``, ``sync/_wire.py``), the drivers' cluster subclasses
(``engine/_driver.py``, ``sync/_driver.py``), the Sentinel connections (``*/_sentinel.py``) and
the error boundary (``drivers_common.py``) reach past redis-py's public API.  When a redis-py
release renames or reshapes one of these, this module fails by name, before the lanes quietly
fall back to the slow path or break.  ``scripts/matrix.sh`` runs ``tests/engine`` (this file
included) in the newest and the lowest (redis 5.0.8) venvs; nothing here needs Airflow.

Where our code already accepts two shapes (``ConnectionPool.get_connection`` with or without a
command name), both are accepted here too.
"""

from __future__ import annotations

import asyncio
import inspect
import socket

import hiredis
import pytest
import redis
import redis.asyncio as aioredis
from redis import exceptions as rexc
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import RedisCluster
from servers import free_port

pytestmark = pytest.mark.timeout(60)


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


# ---- the error boundary and the lanes' reply parser (drivers_common.py) --------------------


def test_base_parser_parse_error_maps_reply_codes_to_classes() -> None:
    """``hiredis.Reader(replyError=BaseParser.parse_error)``: called with the error text, it
    returns (not raises) redis-py's class for the code, with the code stripped from known ones."""
    from redis._parsers.base import BaseParser

    cases = {
        "NOSCRIPT No matching script.": rexc.NoScriptError,
        "READONLY You can't write against a read only replica.": rexc.ReadOnlyError,
        "NOPERM this user has no permissions to run the 'evalsha' command": rexc.NoPermissionError,
        "LOADING Redis is loading the dataset in memory": rexc.BusyLoadingError,
        "BUSYGROUP Consumer Group name already exists": rexc.ResponseError,
        "NOGROUP No such key 'k' or consumer group 'g'": rexc.ResponseError,
        "ERR unknown command 'X'": rexc.ResponseError,
    }
    for text, cls in cases.items():
        err = BaseParser.parse_error(text)
        assert type(err) is cls, (text, type(err))
    # codes redis-py has no class for keep their code in the message (translate_error reads it)
    assert str(BaseParser.parse_error("BUSYGROUP Consumer Group name already exists")).startswith("BUSYGROUP ")
    assert str(BaseParser.parse_error("NOGROUP No such key")).startswith("NOGROUP ")
    assert (
        str(BaseParser.parse_error("NOPERM this user has no permissions to run the 'evalsha' command")).find(
            "'evalsha'"
        )
        >= 0
    )


def test_hiredis_reader_with_redis_py_error_classes() -> None:
    from airflow_provider_chasqui.drivers_common import new_reader

    reader = new_reader()
    reader.feed(b"-NOSCRIPT No matching script.\r\n+OK\r\n$3\r\nabc\r\n")
    first = reader.gets()
    assert isinstance(first, rexc.NoScriptError)
    assert reader.gets() == b"OK" and reader.gets() == b"abc" and reader.gets() is False
    assert hiredis.pack_command(("SET", "k", 1)) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n1\r\n"


def test_the_exception_classes_we_catch_and_their_bases() -> None:
    assert issubclass(rexc.NoScriptError, rexc.ResponseError)
    assert issubclass(rexc.ReadOnlyError, rexc.ResponseError)
    assert issubclass(rexc.NoPermissionError, rexc.ResponseError)
    assert issubclass(rexc.ClusterDownError, rexc.ResponseError)
    assert issubclass(rexc.MasterDownError, rexc.ClusterDownError)
    assert issubclass(rexc.TryAgainError, rexc.ResponseError)
    assert issubclass(rexc.BusyLoadingError, rexc.ConnectionError)
    assert issubclass(rexc.AuthenticationError, rexc.ConnectionError)
    assert issubclass(rexc.InvalidResponse, rexc.RedisError)
    assert issubclass(rexc.ResponseError, rexc.RedisError)
    assert not issubclass(rexc.RedisClusterException, rexc.RedisError)  # why REDIS_ERRORS lists it


def test_key_slot_and_parse_command(shared_redis_url: str) -> None:
    from redis._parsers.helpers import parse_command
    from redis.crc import key_slot

    assert key_slot(b"{q}:stream") == key_slot(b"q") == key_slot(b"{q}:events")
    with redis.Redis.from_url(shared_redis_url, protocol=2) as r:
        r.response_callbacks.clear()
        listing = r.execute_command("COMMAND")
    parsed = parse_command(listing)  # what _command_listing_only hands the async cluster client
    assert isinstance(parsed, dict) and "get" in parsed and "xreadgroup" in parsed


# ---- the blocking lane (sync/_wire.py) ----------------------------------------------------


def test_sync_connection_socket_after_connect(shared_redis_url: str) -> None:
    """``SyncLane`` talks on ``conn._sock`` after ``conn.connect()``; ``disconnect()`` clears it."""
    from airflow_provider_chasqui.drivers_common import new_reader, supported
    from airflow_provider_chasqui.sync._driver import raw_client

    client = raw_client(shared_redis_url)
    try:
        pool = client.connection_pool
        conn = pool.make_connection()
        assert supported(conn) and hasattr(conn, "_sock") and conn._sock is None
        conn.connect()
        sock = conn._sock
        assert isinstance(sock, socket.socket)
        sock.sendall(hiredis.pack_command(("PING",)))
        reader = new_reader()
        reply = False
        while reply is False:
            reader.feed(sock.recv(65536))
            reply = reader.gets()
        assert reply == b"PONG"
        assert conn.socket_timeout is None or isinstance(conn.socket_timeout, (int, float))
        conn.disconnect()
        assert conn._sock is None
    finally:
        client.close()


def test_sync_pool_and_connection_methods_the_driver_uses(shared_redis_url: str) -> None:
    from airflow_provider_chasqui.sync._driver import _get_connection, raw_client

    client = raw_client(shared_redis_url)
    try:
        pool = client.connection_pool
        assert isinstance(pool.connection_kwargs, dict)
        conn = _get_connection(pool)  # get_connection() (>= 5.3) or get_connection(name)
        try:
            packed = conn.pack_command("PING")
            assert isinstance(packed, list) and all(isinstance(p, (bytes, memoryview)) for p in packed)
            assert "check_health" in _params(conn.send_packed_command)
            conn.send_packed_command(packed, check_health=True)
            assert conn.read_response() == b"PONG"
        finally:
            pool.release(conn)
    finally:
        client.close()


# ---- the asyncio lane (engine/_wire.py, engine/_driver.py) -------------------------------


async def test_async_connection_reader_writer_transport(shared_redis_url: str) -> None:
    """``AsyncLane._connect`` takes ``conn._writer.transport`` (with ``set_protocol``), checks
    ``conn._reader._buffer`` is empty, then sets both to None; ``is_connected`` follows them."""
    from airflow_provider_chasqui.drivers_common import supported
    from airflow_provider_chasqui.engine._clients import raw_client

    client = raw_client(shared_redis_url)
    try:
        conn = client.connection_pool.make_connection()
        assert supported(conn)
        await conn.connect()
        assert conn.is_connected
        assert isinstance(conn._reader, asyncio.StreamReader)
        assert conn._reader._buffer == b"" and isinstance(conn._reader._buffer, bytearray)
        writer = conn._writer
        assert isinstance(writer, asyncio.StreamWriter)
        transport = writer.transport
        assert hasattr(transport, "set_protocol") and hasattr(transport, "get_extra_info")
        assert isinstance(transport.get_extra_info("socket").fileno(), int)
        assert isinstance(getattr(transport, "_sock", None), socket.socket)  # _close_orphan (CPython)
        assert hasattr(conn, "socket_timeout") and hasattr(conn, "protocol")
        await conn.disconnect()
        assert not conn.is_connected
    finally:
        await client.aclose()


async def test_async_pool_and_connection_methods_the_driver_uses(shared_redis_url: str) -> None:
    from airflow_provider_chasqui.engine._clients import raw_client
    from airflow_provider_chasqui.engine._driver import _get_connection

    client = raw_client(shared_redis_url)
    try:
        pool = client.connection_pool
        assert isinstance(pool.connection_kwargs, dict)
        cls = pool.connection_class  # replaced by a hiredis-packing subclass (settable, has pack_command)
        assert isinstance(cls, type) and issubclass(cls, aioredis.Connection) and callable(cls.pack_command)
        conn = await _get_connection(pool)
        try:
            await conn.send_packed_command(conn.pack_command("PING"), check_health=True)
            assert await conn.read_response() == b"PONG"
        finally:
            await pool.release(conn)
    finally:
        await client.aclose()


# ---- the cluster clients' routing hooks (engine/_driver.py, sync/_driver.py) -------------


def test_async_cluster_client_internals() -> None:
    """Built without connecting: the attributes ``_RawCluster`` and ``_route_fcall`` use."""
    assert inspect.iscoroutinefunction(AsyncRedisCluster._determine_slot)
    assert _params(AsyncRedisCluster._determine_slot)[0] == "self"
    assert inspect.iscoroutinefunction(AsyncRedisCluster.initialize)
    assert inspect.iscoroutinefunction(AsyncRedisCluster.execute_command)
    assert "target_nodes" in inspect.getsource(AsyncRedisCluster.execute_command)
    client = AsyncRedisCluster(host="127.0.0.1", port=free_port())
    assert client._initialize is True
    assert isinstance(client.command_flags, dict)  # joined two-word names are looked up here
    assert hasattr(client.encoder, "encode")
    assert isinstance(client.response_callbacks, dict)
    parser = client.commands_parser
    assert inspect.iscoroutinefunction(parser.get_keys) and _params(parser.get_keys)[:1] == ["args"]
    assert callable(client.nodes_manager.get_node_from_slot)
    assert callable(client.get_node) and "node_name" in _params(client.get_node)
    assert callable(client.get_primaries)


def test_sync_cluster_client_internals() -> None:
    """``_RawCluster.determine_slot`` and ``_raw_cluster``'s hooks (a live client needs a cluster:
    these are checked on the classes)."""
    from redis.cluster import CommandsParser, NodesManager

    assert _params(RedisCluster.determine_slot) == ["self", "args"]
    assert _params(CommandsParser.get_keys)[:3] == ["self", "redis_conn", "args"]
    assert _params(NodesManager.create_redis_node)[:3] == ["self", "host", "port"]
    init = inspect.getsource(RedisCluster.__init__)
    assert "cluster_response_callbacks" in init and "commands_parser" in init
    assert "nodes_cache" in inspect.getsource(NodesManager.__init__)
    assert "redis_connection" in inspect.getsource(redis.cluster.ClusterNode.__init__)


# ---- Sentinel connections (engine/_sentinel.py, sync/_sentinel.py) ------------------------


def test_sentinel_connection_hooks() -> None:
    from redis.asyncio.sentinel import SentinelManagedConnection as AsyncSMC
    from redis.asyncio.sentinel import SentinelManagedSSLConnection as AsyncSMSSL
    from redis.sentinel import SentinelManagedConnection, SentinelManagedSSLConnection

    for cls in (AsyncSMC, AsyncSMSSL):
        assert inspect.iscoroutinefunction(cls.send_packed_command)
        assert _params(cls.send_packed_command)[1:3] == ["command", "check_health"]
        assert isinstance(inspect.getattr_static(aioredis.Connection, "is_connected"), property)
    for cls in (SentinelManagedConnection, SentinelManagedSSLConnection):
        assert not inspect.iscoroutinefunction(cls.send_packed_command)
        assert _params(cls.send_packed_command)[1:3] == ["command", "check_health"]
