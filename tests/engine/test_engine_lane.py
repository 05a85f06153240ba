"""The asyncio driver's lane (``engine/_wire.py``): one pinned connection, hiredis-packed.

Proven against real servers: the pre-packed XADD is byte for byte what hiredis packs from
the same arguments and writes the entry the generic path writes; concurrent callers get
their own replies; the lane survives a new event loop, a killed connection, a silent server
(socket_timeout) and SCRIPT FLUSH, and falls back to redis-py without writing twice.
Faults run on a server started here (free port), so the shared server is never killed or flushed.
"""

from __future__ import annotations

import asyncio
import time

import hiredis
import pytest
import redis
from engine_support import client_at, pool_connections, stream_entries, stream_job_ids, wait_until, wait_until_sync
from fault_support import FaultProxy
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from servers import RunningServer, start_server

from airflow_provider_chasqui import Queue
from airflow_provider_chasqui.core.calls import command, packed_command, resp_bulk, script_call
from airflow_provider_chasqui.core.codec import decode_data, decode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.producer import ProducerCore
from airflow_provider_chasqui.core.settings import QueueSettings
from airflow_provider_chasqui.drivers_common import IDLE_CHECK_S
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.errors import ChasquiConnectionError, ScriptError

pytestmark = [pytest.mark.timeout(120), pytest.mark.single_node("cluster clients never use the lane")]


def _lane_client(url: str, driver: AsyncDriver) -> dict:
    """The CLIENT LIST entry of the driver's lane connection (found by its local address)."""
    return client_at(url, *driver._lane.proto.transport.get_extra_info("sockname")[:2])


# ---- pre-packed bytes --------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["email", "", "café-✓"])
@pytest.mark.parametrize("max_len", [None, 7, 10**12])
def test_quick_add_packs_what_hiredis_packs(name: str, max_len: int | None) -> None:
    core = ProducerCore("q-pack", QueueSettings(max_stream_len=max_len) if max_len else None)
    call, jid, created = core.quick_add(name, {"to": "a@b.c", "n": [1, 2.5, None, b"\x00\xff"]})
    assert call.script is None and call.keys == () and call.argv == ()
    assert call.packed == hiredis.pack_command(call.args)
    # the generic path's call for the same job (same id and time: the same envelope)
    old = core._xadd(core.prepare(name, {"to": "a@b.c", "n": [1, 2.5, None, b"\x00\xff"]}, job_id=jid, now=created))
    assert old.args == call.args
    assert hiredis.pack_command(old.args) == call.packed
    assert old == call  # ``packed`` takes no part in equality
    fields = call.args[6:]
    assert fields[0] == "d" and (fields[2:] == ("n", name.encode()) if name else len(fields) == 2)
    env = decode_envelope(fields[1])
    assert env.id == jid and env.created_at_ms == created and env.attempt == 0


def test_packed_command_and_resp_bulk() -> None:
    args = ("SET", "k", 12, b"\x00bin", "ü")
    packed = hiredis.pack_command(args)
    c = packed_command(args, packed)
    assert (c.args, c.packed, c.script, c.keys, c.argv) == (args, packed, None, (), ())
    assert c == command(*args)
    assert packed == b"*%d\r\n" % len(args) + b"".join(resp_bulk(a) for a in args)
    for value in ("", "x", "ü✓", 0, -7, 2**63, b"", b"\r\n"):
        assert resp_bulk(value) == hiredis.pack_command((value,))[len(b"*1\r\n") :]
    for bad in (1.5, None, True):
        with pytest.raises(TypeError):
            resp_bulk(bad)


async def test_lane_and_redis_py_write_the_same_entry(redis_url: str, queue_name: str) -> None:
    data = {"k": "v", "n": 3, "b": b"\x01"}
    async with (
        Queue(queue_name, redis_url=redis_url) as fast,
        Queue(queue_name, driver=AsyncDriver(redis_url, lane=False)) as slow,
    ):
        jobs = [
            await fast.add("named", data),
            await fast.add("", data),
            await slow.add("named", data),
            await slow.add("", data),
        ]
        assert fast.driver._lane.proto is not None and not fast.driver._lane.proto.closed
        assert pool_connections(fast.driver) == 0  # every call took the lane
        assert slow.driver._lane is None
    entries = stream_entries(redis_url, queue_name)
    assert len(entries) == 4
    for job, (_eid, fields) in zip(jobs, entries):
        env = decode_envelope(fields["d"])
        assert env.id == job.id and env.created_at_ms == job.created_at_ms and env.attempt == 0
        assert decode_data(env.inner) == data
    shapes = [sorted(f) for _e, f in entries]
    assert shapes == [["d", "n"], ["d"], ["d", "n"], ["d"]]
    assert entries[0][1]["n"] == entries[2][1]["n"] == b"named"
    # the envelopes differ only in the id and the creation time
    a, b = decode_envelope(entries[0][1]["d"]), decode_envelope(entries[2][1]["d"])
    assert (a.inner, a.attempt, a.retry) == (b.inner, b.attempt, b.retry)


# ---- concurrency and event loops ---------------------------------------------------------------
async def test_500_concurrent_adds_each_land_once(redis_url: str, queue_name: str) -> None:
    async with Queue(queue_name, redis_url=redis_url) as q:
        jobs = await asyncio.gather(*(q.add("c", {"i": i}) for i in range(500)))
        assert pool_connections(q.driver) == 0
    assert len({j.id for j in jobs}) == 500
    by_id = {}
    for _eid, fields in stream_entries(redis_url, queue_name):
        env = decode_envelope(fields["d"])
        assert env.id not in by_id, f"{env.id} written twice"
        by_id[env.id] = decode_data(env.inner)["i"]
    assert by_id == {j.id: j.data["i"] for j in jobs}


async def test_concurrent_replies_go_to_their_callers(redis_url: str, queue_name: str) -> None:
    """Each caller gets its own reply: XADD's entry id holds that caller's value, GET its key."""
    stream = QueueKeys.for_queue(queue_name).stream
    prefix = QueueKeys.for_queue(queue_name).prefix
    driver = AsyncDriver(redis_url)
    try:

        async def one(i: int) -> tuple[int, bytes, bytes]:
            await asyncio.sleep(0)  # interleave the tasks
            eid = await driver.call(command("XADD", stream, "*", "i", i))
            await driver.call(command("SET", f"{prefix}:k{i}", f"v{i}"))
            return i, eid, await driver.call(command("GET", f"{prefix}:k{i}"))

        results = await asyncio.gather(*(one(i) for i in range(300)))
        assert pool_connections(driver) == 0
    finally:
        await driver.close()
    with redis.Redis.from_url(redis_url) as r:
        written = {eid: int(fields[b"i"]) for eid, fields in r.xrange(stream)}
    assert len(written) == 300
    for i, eid, value in results:
        assert written[eid] == i
        assert value == f"v{i}".encode()


async def test_cancelled_callers_do_not_shift_replies(redis_url: str, queue_name: str) -> None:
    """A caller cancelled after sending still owns the next reply: later callers get theirs."""
    prefix = QueueKeys.for_queue(queue_name).prefix
    driver = AsyncDriver(redis_url)
    try:
        await driver.pipeline([command("SET", f"{prefix}:k{i}", f"v{i}") for i in range(200)])
        for _round in range(5):
            doomed = [asyncio.ensure_future(driver.call(command("GET", f"{prefix}:k{i}"))) for i in range(100)]
            await asyncio.sleep(0)  # let them send
            for t in doomed[::2]:
                t.cancel()
            kept = await asyncio.gather(*(driver.call(command("GET", f"{prefix}:k{i}")) for i in range(100, 200)))
            assert kept == [f"v{i}".encode() for i in range(100, 200)]
            done = await asyncio.gather(*doomed, return_exceptions=True)
            for i, r in enumerate(done):
                assert isinstance(r, asyncio.CancelledError) if i % 2 == 0 else r == f"v{i}".encode()
        assert not driver._lane.proto.closed and pool_connections(driver) == 0
    finally:
        await driver.close()


def test_driver_reused_across_asyncio_run(redis_url: str, queue_name: str) -> None:
    """A new event loop gets a new lane; the old loop's transport is not touched."""
    q = Queue(queue_name, redis_url=redis_url)
    first = asyncio.run(q.add("loop", {"run": 1}))
    proto1 = q.driver._lane.proto
    addr1 = _lane_client(redis_url, q.driver)["addr"]
    second = asyncio.run(q.add("loop", {"run": 2}))
    proto2 = q.driver._lane.proto
    assert proto2 is not proto1 and not proto2.closed
    # the first loop's connection is closed when the lane moves on, not left to the collector
    assert proto1.transport.get_extra_info("socket").fileno() == -1
    with redis.Redis.from_url(redis_url) as r:
        wait_until_sync(
            lambda: addr1 not in {c["addr"] for c in r.client_list()},
            10,
            what="the first loop's lane connection to close",
        )

    async def more() -> list:
        jobs = await q.add_bulk([{"name": "loop", "data": {"run": 3, "i": i}} for i in range(300)])
        await q.close()
        return jobs

    bulk = asyncio.run(more())
    ids = stream_job_ids(redis_url, queue_name)
    assert ids == [first.id, second.id] + [j.id for j in bulk]


# ---- connection faults --------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["id", "addr"])
async def test_killed_lane_connection_falls_back_and_reopens(own_url: str, queue_name: str, how: str) -> None:
    driver = AsyncDriver(own_url)
    q = Queue(queue_name, driver=driver)
    try:
        jobs = [await q.add("k", {"i": 0})]
        proto = driver._lane.proto
        lane = _lane_client(own_url, driver)
        assert lane["cmd"] == "xadd"
        with redis.Redis.from_url(own_url) as r:
            if how == "id":
                assert r.client_kill_filter(_id=lane["id"]) == 1
            else:
                assert r.client_kill_filter(addr=lane["addr"]) == 1
        # Wait (without yielding to the event loop, so connection_lost is not processed) until the
        # server's FIN reached the socket: the next call must notice the close unseen by the loop
        # and reopen rather than write on it.  Redis may free a killed client after replying to
        # CLIENT KILL, so on a loaded box the FIN can trail the reply.
        deadline = time.monotonic() + 10
        while not proto.peer_closed():
            assert time.monotonic() < deadline, "the server never closed the killed lane's socket"
            time.sleep(0.001)
        assert not proto.closed  # the loop has not seen it yet
        # the lane looks at an idle socket only IDLE_CHECK_S after its last send (a busy lane never
        # pays the select): on a fast box the FIN can arrive sooner, so wait that out too, unyielding
        time.sleep(max(0.0, IDLE_CHECK_S - (proto.loop.time() - proto.last_send)) + 0.002)
        jobs.append(await q.add("k", {"i": 1}))
        await wait_until(lambda: proto.closed, 10, what="the killed lane to be seen closed")
        jobs += [await q.add("k", {"i": i}) for i in range(2, 20)]
        jobs += await q.add_bulk([{"name": "k", "data": {"i": i}} for i in range(20, 520)])
        assert driver._lane.proto is not proto and not driver._lane.proto.closed  # reopened
        assert _lane_client(own_url, driver)["cmd"] == (
            "fcall" if driver._fn else "evalsha"
        )  # the bulk add's script ran on it
        # a kill while idle is noticed (connection_lost) and the next call reopens at once
        with redis.Redis.from_url(own_url) as r:
            assert r.client_kill_filter(_id=_lane_client(own_url, driver)["id"]) == 1
        proto2 = driver._lane.proto
        await wait_until(lambda: proto2.closed, 10, what="the lane to notice the kill")
        jobs.append(await q.add("k", {"i": 520}))
        assert driver._lane.proto is not proto2 and not driver._lane.proto.closed
    finally:
        await q.close()
    ids = stream_job_ids(own_url, queue_name)
    assert sorted(ids) == sorted(j.id for j in jobs)  # all there, none twice
    assert len(set(ids)) == len(ids) == 521


async def test_silent_server_times_out_then_recovers(own_url: str, own_server: RunningServer, queue_name: str) -> None:
    async with FaultProxy(own_server.port) as proxy:
        driver = AsyncDriver(proxy.url, socket_timeout=1.0, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))
        q = Queue(queue_name, driver=driver)
        try:
            before = [await q.add("s", {"i": i}) for i in range(5)]
            proto = driver._lane.proto
            assert proto is not None
            proxy.pause()
            t0 = time.monotonic()
            with pytest.raises(ChasquiConnectionError):
                await asyncio.wait_for(q.add("s", {"i": "lost"}), 30)
            waited = time.monotonic() - t0
            print(f"\n[silent server] ChasquiConnectionError after {waited:.2f}s (socket_timeout=1, no retries)")
            assert proto.closed  # the timer aborted the stalled lane
            assert waited < 15, f"took {waited:.1f}s to time out with socket_timeout=1"
            with pytest.raises(ChasquiConnectionError):  # scripts and bulk adds too
                await asyncio.wait_for(q.add_bulk([{"name": "s", "data": {"i": "lost"}}] * 3), 30)
            proxy.cut()
            proxy.resume()
            # the lane waits _RETRY_AFTER_S after a failed open; redis-py serves meanwhile
            after = [await q.add("s", {"i": i}) for i in range(5, 10)]
            after += await q.add_bulk([{"name": "s", "data": {"i": i}} for i in range(10, 210)])
        finally:
            await q.close()
    envs = [decode_envelope(f["d"]) for _e, f in stream_entries(own_url, queue_name)]
    counts: dict[str, int] = {}
    for env in envs:
        counts[env.id] = counts.get(env.id, 0) + 1
    for job in before + after:
        assert counts.get(job.id) == 1, f"{job.id} written {counts.get(job.id, 0)} times"


async def test_lane_reopens_after_timeout(own_url: str, own_server: RunningServer, queue_name: str) -> None:
    """After a stall the lane itself comes back (not only the redis-py path)."""
    async with FaultProxy(own_server.port) as proxy:
        driver = AsyncDriver(proxy.url, socket_timeout=1.0, retry=Retry(NoBackoff(), 0))
        try:
            await driver.call(command("SET", f"{QueueKeys.for_queue(queue_name).prefix}:x", "1"))
            old = driver._lane.proto
            proxy.pause()
            with pytest.raises(ChasquiConnectionError):  # the driver's typed error
                await asyncio.wait_for(driver.call(command("GET", f"{QueueKeys.for_queue(queue_name).prefix}:x")), 30)
            assert old.closed
            proxy.cut()
            proxy.resume()

            async def lane_back() -> bool:
                value = await driver.call(command("GET", f"{QueueKeys.for_queue(queue_name).prefix}:x"))
                assert value == b"1"
                p = driver._lane.proto
                return p is not None and p is not old and not p.closed

            await wait_until(lane_back, 15, what="the lane to reopen", interval=0.1)
        finally:
            await driver.close()


async def test_script_flush_is_reloaded_on_the_lane(own_url: str, queue_name: str, monkeypatch) -> None:
    monkeypatch.setenv("CHASQUI_FUNCTIONS", "off")  # EVALSHA (FUNCTION FLUSH: tests/security/test_functions.py)
    keys = QueueKeys.for_queue(queue_name)
    driver = AsyncDriver(own_url)
    q = Queue(queue_name, driver=driver)
    try:
        jobs = await q.add_bulk([{"name": "f", "data": {"i": i}} for i in range(600)])  # streamed script calls
        proto = driver._lane.proto
        flush = redis.Redis.from_url(own_url)
        try:
            flush.script_flush()
            jobs += await q.add_bulk([{"name": "f", "data": {"i": i}} for i in range(600, 1200)])  # Stream
            flush.script_flush()
            jobs += await q.add_bulk([{"name": "f", "data": {"i": i}, "delay": 60_000} for i in range(3)])  # pipeline
            flush.script_flush()
            one = ProducerCore(queue_name).prepare("f", {"i": "one"})
            jobs.append(one)
            call = script_call("enqueue_batch", (keys.stream,), (10_000, one.envelope, one.name_bytes))
            assert await driver.call(call)  # one call
            flush.script_flush()
            replies = await driver.pipeline([command("XLEN", keys.stream), command("ZCARD", keys.delayed)])
            assert [int(x) for x in replies] == [1201, 3]
            two = ProducerCore(queue_name).prepare("f", {"i": "two"})
            jobs.append(two)
            flush.script_flush()
            call2 = script_call("enqueue_batch", (keys.stream,), (10_000, two.envelope, two.name_bytes))
            replies = await driver.pipeline([call2, command("XLEN", keys.stream)])
            assert replies[0] and int(replies[1]) == 1201  # only the script re-ran, after XLEN
            assert int(await driver.call(command("XLEN", keys.stream))) == 1202
        finally:
            flush.close()
        assert driver._lane.proto is proto and not proto.closed  # NOSCRIPT does not drop the lane
    finally:
        await q.close()
    ids = stream_job_ids(own_url, queue_name)
    with redis.Redis.from_url(own_url) as r:
        assert r.zcard(keys.delayed) == 3
    assert len(ids) == len(set(ids)) == 1202  # each streamed chunk ran once, none twice
    assert set(ids) == {j.id for j in jobs[:1200]} | {jobs[-2].id, jobs[-1].id}


async def test_readonly_reply_closes_the_lane(own_url: str, queue_name: str, tmp_path) -> None:
    """A demoted master answers READONLY: the lane lets go of that connection (one add, a
    pipeline), so the next call reconnects through redis-py (Sentinel finds the new master)."""
    other = start_server("redis7", tmpdir=tmp_path)
    driver = AsyncDriver(own_url)
    q = Queue(queue_name, driver=driver)
    admin = redis.Redis.from_url(own_url)
    key = f"{QueueKeys.for_queue(queue_name).prefix}:x"
    try:
        jobs = [await q.add("ro", {"i": 0})]
        admin.replicaof("127.0.0.1", other.port)
        try:
            for attempt in ("add", "pipeline"):
                assert await driver.call(command("PING")) == b"PONG"  # (re)opens the lane on the replica
                proto = driver._lane.proto
                assert proto is not None and not proto.closed
                with pytest.raises(Exception, match="read only replica"):
                    if attempt == "add":
                        await q.add("ro", {"i": "no"})
                    else:
                        await driver.pipeline([command("SET", key, 1), command("GET", key)])
                assert driver._lane.proto is None and proto.closed, f"{attempt}: the lane kept its read-only connection"
        finally:
            admin.replicaof("NO", "ONE")
        jobs.append(await q.add("ro", {"i": 1}))
        assert driver._lane.proto is not None and not driver._lane.proto.closed
    finally:
        await q.close()
        admin.close()
        other.stop()
    ids = stream_job_ids(own_url, queue_name)  # a finished resync from ``other`` may have emptied the stream
    assert jobs[-1].id in ids and set(ids) <= {j.id for j in jobs}


# ---- TLS and ACL: the lane inherits redis-py's handshake -----------------------------------------


def test_lane_over_tls_and_across_event_loops(tls_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url=tls_url)
    first = asyncio.run(q.add("tls", {"i": 0}))
    proto1 = q.driver._lane.proto
    assert proto1 is not None and pool_connections(q.driver) == 0  # the lane took it, encrypted

    async def more() -> list:
        jobs = [await q.add("tls", {"i": 1})]
        jobs += await asyncio.gather(*(q.add("tls", {"i": i}) for i in range(2, 200)))
        jobs += await q.add_bulk([{"name": "tls", "data": {"i": i}} for i in range(200, 700)])
        assert q.driver._lane.proto is not proto1
        assert pool_connections(q.driver) <= 1  # the SCRIPT LOAD of a new server's first NOSCRIPT
        await q.close()
        return jobs

    jobs = [first] + asyncio.run(more())  # the first loop's TLS connection is closed on the way
    with redis.Redis.from_url(tls_url) as r:
        wait_until_sync(lambda: len(r.client_list()) == 1, 10, what="only the inspecting client left")
        ids = [decode_envelope(f[b"d"]).id for _e, f in r.xrange(QueueKeys.for_queue(queue_name).stream)]
        keys = list(r.scan_iter(match=QueueKeys.for_queue(queue_name).prefix.replace("{", "\\{") + "*"))
        r.delete(*keys)
    assert sorted(ids) == sorted(j.id for j in jobs) and len(ids) == 700


async def test_lane_with_an_acl_user(own_url: str, own_server: RunningServer, queue_name: str) -> None:
    """The lane authenticates as the URL's user: its commands run under that user's ACL."""
    prefix = QueueKeys.for_queue(queue_name).prefix
    user = f"lane-{queue_name}"
    with own_server.client() as admin:
        admin.acl_setuser(
            user,
            enabled=True,
            passwords=["+s3cret"],
            keys=[f"{prefix}*"],
            commands=["+@all", "-@dangerous"],
            reset_keys=True,
        )
    url = f"redis://{user}:s3cret@127.0.0.1:{own_server.port}/0"
    try:
        async with Queue(queue_name, redis_url=url) as q:
            jobs = [await q.add("acl", {"i": i}) for i in range(5)]
            jobs += await q.add_bulk([{"name": "acl", "data": {"i": i}} for i in range(5, 300)])
            assert q.driver._lane.proto is not None and pool_connections(q.driver) <= 1  # SCRIPT LOAD
            lane = _lane_client(own_url, q.driver)
            assert lane["user"] == user and lane["cmd"] == "fcall"  # it may load the library
            with pytest.raises(ScriptError, match="no permissions"):  # a key outside the user's pattern
                await q.driver.call(command("SET", "not-the-users-key", 1))
            assert not q.driver._lane.proto.closed  # an error reply leaves the lane in step
            assert (await q.add("acl", {"i": "last"})).id
    finally:
        with own_server.client() as admin:
            admin.acl_deluser(user)
    assert len(stream_job_ids(own_url, queue_name)) == 301
