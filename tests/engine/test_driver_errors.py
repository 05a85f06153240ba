"""The drivers' error boundary (issue #17): every redis-py error leaves a driver's public
methods as one of the package's typed errors, Redis' message kept, in both twins.

Real Redis (the shared server and a port nothing listens on); each typed error is provoked
through the public driver API (``call``, ``pipeline``, ``run``)."""

from __future__ import annotations

import re
import uuid

import pytest
import redis
from servers import free_port

from airflow_provider_chasqui.core.calls import command, script_call
from airflow_provider_chasqui.core.scan import scan_call
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.errors import (
    BusyGroupError,
    ChasquiConnectionError,
    ChasquiError,
    NoGroupError,
    NoScriptError,
    ScriptError,
    WrongTypeError,
)
from airflow_provider_chasqui.sync._driver import SyncDriver

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def stream_key(redis_url: str):
    key = f"{{chasqui-test-errors-{uuid.uuid4().hex}}}:stream"
    yield key
    d = SyncDriver(redis_url)  # plain or ?cluster=true
    try:
        d.call(command("DEL", key))
    finally:
        d.close()


def _create(key: str):
    return command("XGROUP", "CREATE", key, "g", "$", "MKSTREAM")


def _read_missing_group(key: str):
    return command("XREADGROUP", "GROUP", "no-such-group", "c", "COUNT", 1, "STREAMS", key, ">")


#: the largest stream id: once a stream's last id is this, ``XADD *`` fails (a full stream)
_LAST_ID = "18446744073709551615-18446744073709551615"


def _full_stream_calls(key: str) -> list:
    """A plain ``XADD *`` and the bulk producer's script, each refused by a full ``key``."""
    return [command("XADD", key, "*", "d", b"x"), script_call("enqueue_batch", (key,), (100, b"x", "job"))]


def _full(key: str) -> str:
    """What a refused add says: the key, why, and the way out (Redis' text names none)."""
    return re.escape(key) + r" is full \(its last id is the largest a stream can hold.*: delete the stream"


def _flow(call):
    reply = yield call
    return reply


# ---- blocking twin ------------------------------------------------------------------------


def test_sync_busy_group(redis_url: str, stream_key: str) -> None:
    d = SyncDriver(redis_url)
    try:
        d.call(_create(stream_key))
        with pytest.raises(BusyGroupError, match="BUSYGROUP") as info:
            d.call(_create(stream_key))
        assert isinstance(info.value, ScriptError) and isinstance(info.value.__cause__, redis.ResponseError)
        with pytest.raises(BusyGroupError):
            d.pipeline([_create(stream_key)])
        with pytest.raises(BusyGroupError):
            d.run(_flow(_create(stream_key)))
    finally:
        d.close()


def test_sync_no_group(redis_url: str, stream_key: str) -> None:
    d = SyncDriver(redis_url)
    try:
        d.call(_create(stream_key))
        with pytest.raises(NoGroupError, match="NOGROUP.*no-such-group"):
            d.call(_read_missing_group(stream_key))
        with pytest.raises(NoGroupError):
            d.stream([_read_missing_group(stream_key)])
    finally:
        d.close()


def test_sync_other_error_replies_are_script_errors(redis_url: str, stream_key: str) -> None:
    d = SyncDriver(redis_url)
    try:
        d.call(command("SET", stream_key, "x"))
        with pytest.raises(ScriptError, match="value is not an integer") as info:
            d.call(command("INCR", stream_key))
        assert type(info.value) is ScriptError
        # WRONGTYPE: its own class, naming the key (Redis' text names none), on every path
        with pytest.raises(WrongTypeError, match=f"WRONGTYPE {re.escape(stream_key)} holds another type than XLEN"):
            d.call(command("XLEN", stream_key))
        with pytest.raises(WrongTypeError, match=f"WRONGTYPE {re.escape(stream_key)} holds another type than ZCARD"):
            d.pipeline([command("GET", stream_key), command("ZCARD", stream_key)])
        with pytest.raises(WrongTypeError, match=f"{re.escape(stream_key)} holds another type than XREADGROUP"):
            d.run(_flow(_read_missing_group(stream_key)))
        # a script's WRONGTYPE names its keys and the script (Redis' names a generated function)
        script, said = scan_call(stream_key, "-", count=1), f"WRONGTYPE a key of {re.escape(stream_key)} holds"
        with pytest.raises(WrongTypeError, match=said + " another type than the script scan_entries needs"):
            d.call(script)
        with pytest.raises(WrongTypeError, match=said):
            d.pipeline([command("GET", stream_key), script])
        with pytest.raises(ChasquiError):  # ScriptError; a cluster client cannot route it: ChasquiError
            d.call(command("NO-SUCH-COMMAND"))
    finally:
        d.close()


def test_sync_an_add_to_a_full_stream_names_the_stream(redis_url: str, stream_key: str) -> None:
    d = SyncDriver(redis_url)
    try:
        d.call(command("XADD", stream_key, _LAST_ID, "d", b"junk"))
        plain, script = _full_stream_calls(stream_key)
        with pytest.raises(ScriptError, match=_full(stream_key)) as info:
            d.call(plain)
        assert "XADD cannot add to it" in str(info.value)
        with pytest.raises(ScriptError, match=_full(stream_key)) as info:
            d.call(script)
        assert "the script enqueue_batch cannot add to it" in str(info.value)
        for call in (plain, script):
            with pytest.raises(ScriptError, match=_full(stream_key)):
                d.pipeline([command("XLEN", stream_key), call])
        assert d.call(command("XLEN", stream_key)) == 1  # nothing was added
    finally:
        d.close()


def test_sync_connection_refused(redis_url: str) -> None:
    d = SyncDriver(f"redis://127.0.0.1:{free_port()}")
    try:
        for attempt in (
            lambda: d.call(command("PING")),
            lambda: d.pipeline([command("PING")]),
            lambda: d.run(_flow(command("PING"))),
        ):
            with pytest.raises(ChasquiConnectionError, match="unreachable"):
                attempt()
    finally:
        d.close()


# ---- asyncio twin -------------------------------------------------------------------------


async def test_async_busy_group(redis_url: str, stream_key: str) -> None:
    d = AsyncDriver(redis_url)
    try:
        await d.call(_create(stream_key))
        with pytest.raises(BusyGroupError, match="BUSYGROUP") as info:
            await d.call(_create(stream_key))
        assert isinstance(info.value.__cause__, redis.ResponseError)
        with pytest.raises(BusyGroupError):
            await d.pipeline([_create(stream_key)])
        with pytest.raises(BusyGroupError):
            await d.run(_flow(_create(stream_key)))
    finally:
        await d.close()


async def test_async_no_group(redis_url: str, stream_key: str) -> None:
    d = AsyncDriver(redis_url)
    try:
        await d.call(_create(stream_key))
        with pytest.raises(NoGroupError, match="NOGROUP.*no-such-group"):
            await d.call(_read_missing_group(stream_key))
        with pytest.raises(NoGroupError):
            await d.stream([_read_missing_group(stream_key)])
    finally:
        await d.close()


async def test_async_other_error_replies_are_script_errors(redis_url: str, stream_key: str) -> None:
    d = AsyncDriver(redis_url)
    try:
        await d.call(command("SET", stream_key, "x"))  # the lane
        with pytest.raises(ScriptError, match="value is not an integer") as info:
            await d.call(command("INCR", stream_key))
        assert type(info.value) is ScriptError
        # WRONGTYPE: its own class, naming the key (Redis' text names none), on every path
        with pytest.raises(WrongTypeError, match=f"WRONGTYPE {re.escape(stream_key)} holds another type than XLEN"):
            await d.call(command("XLEN", stream_key))
        with pytest.raises(WrongTypeError, match=f"WRONGTYPE {re.escape(stream_key)} holds another type than ZCARD"):
            await d.pipeline([command("GET", stream_key), command("ZCARD", stream_key)])
        with pytest.raises(WrongTypeError, match=f"{re.escape(stream_key)} holds another type than XREADGROUP"):
            await d.run(_flow(_read_missing_group(stream_key)))
        # a script's WRONGTYPE names its keys and the script (Redis' names a generated function)
        script, said = scan_call(stream_key, "-", count=1), f"WRONGTYPE a key of {re.escape(stream_key)} holds"
        with pytest.raises(WrongTypeError, match=said + " another type than the script scan_entries needs"):
            await d.call(script)
        with pytest.raises(WrongTypeError, match=said):
            await d.pipeline([command("GET", stream_key), script])
        with pytest.raises(ChasquiError):  # redis.asyncio: ScriptError, or ChasquiError on a cluster
            await d.call(command("NO-SUCH-COMMAND"))
    finally:
        await d.close()


async def test_async_an_add_to_a_full_stream_names_the_stream(redis_url: str, stream_key: str) -> None:
    d = AsyncDriver(redis_url)
    try:
        await d.call(command("XADD", stream_key, _LAST_ID, "d", b"junk"))
        plain, script = _full_stream_calls(stream_key)
        with pytest.raises(ScriptError, match=_full(stream_key)) as info:
            await d.call(plain)
        assert "XADD cannot add to it" in str(info.value)
        with pytest.raises(ScriptError, match=_full(stream_key)) as info:
            await d.call(script)
        assert "the script enqueue_batch cannot add to it" in str(info.value)
        for call in (plain, script):
            with pytest.raises(ScriptError, match=_full(stream_key)):
                await d.pipeline([command("XLEN", stream_key), call])
        assert await d.call(command("XLEN", stream_key)) == 1  # nothing was added
    finally:
        await d.close()


async def test_async_connection_refused(redis_url: str) -> None:
    d = AsyncDriver(f"redis://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(ChasquiConnectionError, match="unreachable"):
            await d.call(command("PING"))
        with pytest.raises(ChasquiConnectionError):
            await d.pipeline([command("PING")])
        with pytest.raises(ChasquiConnectionError):
            await d.run(_flow(command("PING")))
    finally:
        await d.close()


# ---- the typed errors themselves ------------------------------------------------------------


def test_no_script_error_from_redis(redis_url: str) -> None:
    """NOSCRIPT (an EVALSHA the server lacks) is translated at the boundary as NoScriptError;
    raw redis-py raises it, the driver never lets it out of a script call (it loads and re-runs)."""
    from airflow_provider_chasqui.drivers_common import translate_error
    from airflow_provider_chasqui.sync._driver import raw_client

    client = raw_client(redis_url)
    try:
        with pytest.raises(redis.exceptions.NoScriptError) as info:
            client.execute_command("EVALSHA", "0" * 40, 1, "{chasqui-test-errors}:k")
    finally:
        client.close()
    err = translate_error(info.value)
    assert isinstance(err, NoScriptError) and isinstance(err, ScriptError)
    assert "No matching script" in str(err)


def test_every_typed_error_is_a_chasqui_error() -> None:
    for cls in (BusyGroupError, NoGroupError, NoScriptError, ScriptError, ChasquiConnectionError):
        assert issubclass(cls, ChasquiError)
