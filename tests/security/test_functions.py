"""The Redis Functions library: generated from ``lua/*.lua`` (stable name, ``no-writes`` where it
applies), loaded by ``chasqui functions install`` or by a driver that may, used by FCALL (on the
lane, in pipelines and streams, on a cluster), reloaded when it goes, and replaced by EVALSHA
where it cannot be loaded.  Real servers; faults on servers started here.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from engine_support import client_at, stream_job_ids, wait_until
from servers import RunningServer, start_server

from airflow_provider_chasqui import Queue, SyncQueue, Worker
from airflow_provider_chasqui.core.calls import command, script_call
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.producer import ProducerCore
from airflow_provider_chasqui.core.scripts import (
    LIBRARY,
    LIBRARY_PREFIX,
    SCRIPTS,
    build_library,
    lua_dir,
    read_bodies,
)
from airflow_provider_chasqui.engine._driver import AsyncDriver
from airflow_provider_chasqui.errors import ConfigError, ScriptError
from airflow_provider_chasqui.ops.functions import install, status
from airflow_provider_chasqui.sync._driver import SyncDriver

pytestmark = pytest.mark.timeout(120)


def _bodies() -> dict[str, bytes]:
    return read_bodies(lua_dir())


def _libraries(r: redis.Redis) -> dict[str, dict[str, list[str]]]:
    """Loaded libraries: name -> {function name: flags}."""
    out = {}
    for lib in r.execute_command("FUNCTION", "LIST"):
        f = dict(zip(lib[::2], lib[1::2]))
        funcs = {}
        for fn in f[b"functions"]:
            g = dict(zip(fn[::2], fn[1::2]))
            funcs[g[b"name"].decode()] = sorted(x.decode() for x in g[b"flags"])
        out[f[b"library_name"].decode()] = funcs
    return out


def _delete_library(r: redis.Redis) -> None:
    try:
        r.execute_command("FUNCTION", "DELETE", LIBRARY.name)
    except redis.ResponseError as exc:
        assert "not found" in str(exc).lower() or "no such library" in str(exc).lower(), exc


@pytest.fixture
def bare(own_server: RunningServer) -> RunningServer:
    """``own_server`` without this version's library (other libraries stay)."""
    with own_server.client() as r:
        _delete_library(r)
    return own_server


# ---- the generated library -------------------------------------------------------------------
def test_library_is_generated_from_the_scripts_with_a_stable_name() -> None:
    bodies = _bodies()
    again, fcalls = build_library(dict(reversed(list(bodies.items()))))
    assert again == LIBRARY  # the same files, in any order: the same name and source
    assert LIBRARY.name.startswith(LIBRARY_PREFIX) and len(LIBRARY.name) == len(LIBRARY_PREFIX) + 12
    assert LIBRARY.source.startswith(f"#!lua name={LIBRARY.name}\n".encode())
    for stem, body in bodies.items():  # each script's text, verbatim, as a function of KEYS and ARGV
        assert f"local function f_{stem}(KEYS, ARGV)\n".encode() + body.rstrip(b"\n") + b"\nend\n" in LIBRARY.source
        assert SCRIPTS[stem].function == f"{LIBRARY.name}_{stem}" and SCRIPTS[stem].fcall == fcalls[stem]
    assert {s for s, f in fcalls.items() if f == "FCALL_RO"} == {
        "fetch_due",
        "job_counts",
        "scan_entries",
        "stream_ends",
        "stream_last_id",
    }
    assert {s for s in bodies if f"callback=f_{s}, flags={{'allow-oom'}}".encode() in LIBRARY.source} == {
        "complete_batch",
        "fail_batch",
        "dead_letter",
        "cancel_jobs",
        "renew_lease",
    }  # the scripts that XACK, and the lease renewal (XCLAIM)
    changed = dict(bodies, promote=bodies["promote"] + b"-- one more byte\n")
    assert build_library(changed)[0].name != LIBRARY.name  # another version: another library
    # a call the wrapper cannot read (redis.call(unpack(t))) is taken as a write
    assert build_library({"r": b"return redis.call('GET', KEYS[1])"})[1] == {"r": "FCALL_RO"}
    assert build_library({"w": b"local t = {'GET', KEYS[1]}\nreturn redis.call(unpack(t))"})[1] == {"w": "FCALL"}
    for bad in ("Promote", "probe", "a-b"):
        with pytest.raises(ValueError, match="script name"):
            build_library({bad: b"return 1"})


def test_library_loads_on_every_server_with_its_flags(server_matrix: RunningServer, queue_name: str) -> None:
    """Each function runs as its script does: the same replies for the same calls."""
    rows = install(server_matrix.url)
    assert [r["outcome"] for r in rows] in (["loaded"], ["present"])
    keys = QueueKeys.for_queue(queue_name)
    with server_matrix.client() as r:
        funcs = _libraries(r)[LIBRARY.name]
        assert set(funcs) == {s.function for s in SCRIPTS.values()} | {LIBRARY.probe}
        acks = {
            SCRIPTS[s].function for s in ("complete_batch", "fail_batch", "dead_letter", "cancel_jobs", "renew_lease")
        }
        reads = ("_fetch_due", "_job_counts", "_scan_entries", "_stream_ends", "_stream_last_id", "_probe")
        for name, flags in funcs.items():
            expected = ["no-writes"] if name.endswith(reads) else ["allow-oom"] if name in acks else []
            assert flags == expected, (name, flags)
        assert r.execute_command("FCALL_RO", LIBRARY.probe, 0) == LIBRARY.name.encode()
        lock = keys.prefix + ":promoter:lock"
        assert r.execute_command("FCALL", SCRIPTS["acquire_lock"].function, 1, lock, "a", 5) == 1
        assert r.eval(SCRIPTS["acquire_lock"].body, 1, lock, "b", 5) == 0  # the function's lock holds
        assert r.execute_command("FCALL", SCRIPTS["release_lock"].function, 1, lock, "a") == 1
        r.zadd(keys.repeat, {"k1": 5})
        due = r.execute_command("FCALL_RO", SCRIPTS["fetch_due"].function, 1, keys.repeat, 10, 10, keys.prefix)
        assert due == r.eval(SCRIPTS["fetch_due"].body, 1, keys.repeat, 10, 10, keys.prefix)
        with pytest.raises(redis.ResponseError, match="write flag"):  # writers never run as FCALL_RO
            r.execute_command("FCALL_RO", SCRIPTS["acquire_lock"].function, 1, lock, "a", 5)


# ---- the drivers: FCALL, reloading, falling back --------------------------------------------
async def test_async_driver_loads_the_library_and_reloads_it_when_deleted(bare: RunningServer, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    driver = AsyncDriver(bare.url)
    q = Queue(queue_name, driver=driver)
    admin = bare.client()
    try:
        jobs = [await q.add_unique("f", {"i": 0}, key="u0")]  # the first script call loads it
        assert driver._fn is True and LIBRARY.name in _libraries(admin)
        proto = driver._lane.proto
        assert client_at(bare.url, *proto.transport.get_extra_info("sockname")[:2])["cmd"] == "fcall"
        _delete_library(admin)
        jobs += await q.add_bulk([{"name": "f", "data": {"i": i}} for i in range(1, 1201)])  # a Stream
        _delete_library(admin)
        jobs += await q.add_bulk([{"name": "f", "data": {"i": i}, "delay": 60_000} for i in range(3)])  # pipeline
        _delete_library(admin)
        one = ProducerCore(queue_name).prepare("f", {"i": "one"})
        assert await driver.call(script_call("enqueue_batch", (keys.stream,), (10_000, one.envelope, one.name_bytes)))
        _delete_library(admin)
        two = ProducerCore(queue_name).prepare("f", {"i": "two"})
        replies = await driver.pipeline(
            [script_call("enqueue_batch", (keys.stream,), (10_000, two.envelope, b"")), command("XLEN", keys.stream)]
        )
        assert replies[0] and int(replies[1]) == 1202  # only the function call re-ran, after XLEN
        assert driver._fn is True and driver._lane.proto is proto and not proto.closed
        assert LIBRARY.name in _libraries(admin)
        stats = admin.info("commandstats")
        assert "cmdstat_evalsha" not in stats and "cmdstat_script|load" not in stats
    finally:
        await q.close()
        admin.close()
    ids = stream_job_ids(bare.url, queue_name)
    assert len(ids) == len(set(ids)) == 1203 and {j.id for j in jobs[1:1201]} <= set(ids)


def test_sync_driver_loads_the_library_and_reloads_it_when_deleted(bare: RunningServer, queue_name: str) -> None:
    keys = QueueKeys.for_queue(queue_name)
    driver = SyncDriver(bare.url)
    admin = bare.client()
    try:
        with SyncQueue(queue_name, driver=driver) as q:
            q.add_unique("f", {"i": 0}, key="u0")
            assert driver._fn is True and LIBRARY.name in _libraries(admin)
            sock = driver._lane._sock
            _delete_library(admin)
            q.add_bulk([{"name": "f", "data": {"i": i}} for i in range(1, 1201)])  # streamed
            _delete_library(admin)
            q.add_bulk([{"name": "f", "data": {"i": i}, "delay": 60_000} for i in range(3)])  # pipeline
            _delete_library(admin)
            one = ProducerCore(queue_name).prepare("f", {"i": "one"})
            assert driver.call(script_call("enqueue_batch", (keys.stream,), (10_000, one.envelope, b"")))
            _delete_library(admin)
            two = ProducerCore(queue_name).prepare("f", {"i": "two"})
            replies = driver.pipeline(
                [
                    script_call("enqueue_batch", (keys.stream,), (10_000, two.envelope, b"")),
                    command("XLEN", keys.stream),
                ]
            )
            assert replies[0] and int(replies[1]) == 1202
            assert driver._fn is True and driver._lane._sock is sock
    finally:
        admin.close()
    ids = stream_job_ids(bare.url, queue_name)
    assert len(ids) == len(set(ids)) == 1203


async def test_concurrent_first_calls_probe_and_load_once(bare: RunningServer, queue_name: str) -> None:
    with bare.client() as admin:
        admin.execute_command("CONFIG", "RESETSTAT")
        async with Queue(queue_name, redis_url=bare.url) as q:
            jobs = await asyncio.gather(*(q.add_unique("f", i, key=f"u{i}") for i in range(200)))
        with SyncQueue(queue_name, redis_url=bare.url) as sq, ThreadPoolExecutor(8) as pool:
            jobs += list(pool.map(lambda i: sq.add_unique("f", i, key=f"s{i}"), range(64)))
        stats = admin.info("commandstats")
    assert stats["cmdstat_fcall_ro"]["calls"] == 2  # one probe per driver, not one per first call
    assert stats["cmdstat_function|load"]["calls"] == 1 and stats["cmdstat_fcall"]["calls"] == 264
    assert len({j.id for j in jobs}) == 264


def _user(server: RunningServer, name: str, queue: str, *grants: str) -> str:
    prefix = QueueKeys.for_queue(queue).prefix
    with server.client() as admin:
        admin.execute_command(
            "ACL", "SETUSER", name, "reset", "on", ">pw", f"~{prefix}*", "+@all", "-@scripting", *grants
        )
    return f"redis://{name}:pw@127.0.0.1:{server.port}/0"


async def test_functions_only_user_is_told_to_install_and_recovers_without_restart(
    bare: RunningServer, queue_name: str
) -> None:
    url = _user(bare, f"fo-{queue_name}", queue_name, "+fcall", "+fcall_ro")
    async with Queue(queue_name, redis_url=url) as q:
        with pytest.raises(ScriptError, match="chasqui functions install"):
            await q.add_unique("f", {"i": 0}, key="u0")
        with SyncQueue(queue_name, redis_url=url) as sq:
            with pytest.raises(ScriptError, match="chasqui functions install"):
                sq.add_bulk([{"name": "f", "data": 1}])
            assert [r["outcome"] for r in install(bare.url)] == ["loaded"]
            assert sq.add_bulk([{"name": "f", "data": 1}])
        assert (await q.add_unique("f", {"i": 0}, key="u0")).id  # the same driver, now on FCALL
        assert q.driver._fn is True
    assert len(stream_job_ids(bare.url, queue_name)) == 2


async def test_script_user_without_the_library_runs_on_evalsha(bare: RunningServer, queue_name: str) -> None:
    """The fallback: FUNCTION LOAD is denied (once per driver), scripts run as EVALSHA."""
    url = _user(bare, f"ev-{queue_name}", queue_name, "+evalsha", "+script|load", "+fcall", "+fcall_ro")
    with bare.client() as admin:
        admin.execute_command("ACL", "LOG", "RESET")
    async with Queue(queue_name, redis_url=url) as q:
        await q.add_unique("f", {"i": 0}, key="u0")
        await q.add_bulk([{"name": "f", "data": {"i": i}} for i in range(1, 500)])
        await q.add_bulk([{"name": "f", "data": 1, "delay": 60_000}])
        assert q.driver._fn is False and not q.driver._may_load
        assert client_at(bare.url, *q.driver._lane.proto.transport.get_extra_info("sockname")[:2])["cmd"] == "evalsha"
    with SyncQueue(queue_name, redis_url=url) as sq:
        sq.add_bulk([{"name": "f", "data": 2}])
        assert sq.driver._fn is False
    with bare.client() as admin:
        denied = [dict(zip(e[::2], e[1::2])) for e in admin.execute_command("ACL", "LOG")]
        assert LIBRARY.name not in _libraries(admin)
    assert {e[b"object"] for e in denied} == {b"function|load"}
    assert sum(int(e[b"count"]) for e in denied) == 2  # one attempt per driver
    assert len(stream_job_ids(bare.url, queue_name)) == 501


def test_chasqui_functions_env(bare: RunningServer, queue_name: str, monkeypatch) -> None:
    with bare.client() as admin:
        monkeypatch.setenv("CHASQUI_FUNCTIONS", "use")  # never loads
        with SyncQueue(queue_name, redis_url=bare.url) as sq:
            sq.add_bulk([{"name": "f", "data": 1}])
            assert sq.driver._fn is False and LIBRARY.name not in _libraries(admin)
        install(bare.url)
        with SyncQueue(queue_name, redis_url=bare.url) as sq:
            sq.add_bulk([{"name": "f", "data": 1}])
            assert sq.driver._fn is True
        monkeypatch.setenv("CHASQUI_FUNCTIONS", "off")  # EVALSHA though the library is there
        admin.execute_command("CONFIG", "RESETSTAT")
        with SyncQueue(queue_name, redis_url=bare.url) as sq:
            sq.add_bulk([{"name": "f", "data": 1}])
            assert sq.driver._fn is False
        stats = admin.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] >= 1 and "cmdstat_fcall" not in stats
    monkeypatch.setenv("CHASQUI_FUNCTIONS", "sometimes")
    with pytest.raises(ConfigError, match="CHASQUI_FUNCTIONS='sometimes': expected auto, use or off"):
        SyncDriver(bare.url)


@pytest.mark.timeout(90)
async def test_workers_drain_a_server_at_maxmemory(tmp_path) -> None:
    """A flagged function is refused outright at maxmemory; the scripts that acknowledge
    (``allow-oom``) still run there, as plain EVALSHA scripts did: a worker started before the
    server filled up drains it, each job once, while new adds are refused."""
    server = start_server("redis7", tmpdir=tmp_path)
    keys = QueueKeys.for_queue("full")
    done: list[str] = []

    async def handler(job) -> None:
        await asyncio.sleep(0.02)
        done.append(job.id)

    try:
        with server.client() as r:
            async with Queue("full", redis_url=server.url) as q:
                jobs = await q.add_bulk([{"name": "n", "data": "x" * 2000} for _ in range(300)])
                worker = Worker(
                    "full",
                    {"n": handler},
                    redis_url=server.url,
                    run_scheduler=False,
                    claim_min_idle_ms=1000,
                    concurrency=5,
                )
                task = asyncio.create_task(worker.run())
                try:
                    await wait_until(lambda: len(done) >= 10, 30, what="the worker to start")
                    r.config_set("maxmemory", r.info("memory")["used_memory"] - 200_000)
                    r.config_set("maxmemory-policy", "noeviction")
                    with pytest.raises(Exception, match="maxmemory"):
                        await q.add_bulk([{"name": "n", "data": 1}])
                    await wait_until(
                        lambda: len(done) >= 300 and r.xpending(keys.stream, "default")["pending"] == 0,
                        30,
                        what="every job acknowledged at maxmemory",
                    )
                finally:
                    await worker.close()
                    await asyncio.wait_for(task, 30)
            assert sorted(done) == sorted(j.id for j in jobs)  # each once: no ack was refused
            assert r.xlen(keys.stream) == 0 and "cmdstat_evalsha" not in r.info("commandstats")
    finally:
        server.stop()


# ---- other versions and other scripts coexist -------------------------------------------------
def test_other_versions_and_foreign_scripts_are_left_alone(bare: RunningServer, queue_name: str) -> None:
    old, _ = build_library(dict(_bodies(), promote=_bodies()["promote"] + b"-- the previous release\n"))
    with bare.client() as admin:
        admin.execute_command("FUNCTION", "LOAD", "REPLACE", old.source)
        foreign = admin.script_load("return 'chasquimq'")
        with SyncQueue(queue_name, redis_url=bare.url) as sq:
            sq.add_unique("f", 1, key="u")
        assert {old.name, LIBRARY.name} <= set(_libraries(admin))
        assert admin.evalsha(foreign, 0) == b"chasquimq"  # no SCRIPT FLUSH, no FUNCTION FLUSH
        assert admin.execute_command("FCALL_RO", old.probe, 0) == old.name.encode()
        (row,) = status(bare.url)
        assert row["loaded"] and row["code_matches"] and old.name in row["other_versions"]
        admin.execute_command("FUNCTION", "DELETE", old.name)


# ---- the CLI ---------------------------------------------------------------------------------
def _chasqui(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_install_and_status(bare: RunningServer, queue_name: str) -> None:
    url = bare.url
    missing = _chasqui("functions", "status", "--redis-url", url)
    assert missing.returncode == 4 and "not loaded" in missing.stdout, missing
    first = _chasqui("functions", "install", "--redis-url", url, "--json")
    assert first.returncode == 0 and [r["outcome"] for r in json.loads(first.stdout)] == ["loaded"], first
    again = _chasqui("functions", "install", "--redis-url", url)
    assert again.returncode == 0 and f"{LIBRARY.name} present" in again.stdout
    with bare.client() as admin:  # same name, other code (tampered): refused without --replace
        admin.execute_command("FUNCTION", "LOAD", "REPLACE", LIBRARY.source.replace(b"-- ", b"--  ", 1))
    assert _chasqui("functions", "status", "--redis-url", url).returncode == 4
    refused = _chasqui("functions", "install", "--redis-url", url)
    assert refused.returncode == 1 and "--replace" in refused.stderr, refused
    replaced = _chasqui("functions", "install", "--redis-url", url, "--replace", "--json")
    assert [r["outcome"] for r in json.loads(replaced.stdout)] == ["replaced"], replaced
    ok = _chasqui("functions", "status", "--redis-url", url, "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)[0]["code_matches"] is True
    runtime = _user(bare, f"cli-{queue_name}", queue_name, "+fcall", "+fcall_ro")  # no FUNCTION rights
    denied = _chasqui("functions", "install", "--redis-url", runtime)
    assert denied.returncode == 1 and "function|load" in denied.stderr, denied


# ---- cluster ----------------------------------------------------------------------------------
async def test_cluster_loads_on_every_master_and_reloads_on_a_node_that_lost_it(cluster_server) -> None:
    import uuid

    queues = [f"fc-{uuid.uuid4().hex[:8]}" for _ in range(12)]  # spread over the masters' slots
    for node in cluster_server.nodes:
        with node.client() as r:
            _delete_library(r)
    getkeys_before = _getkeys_calls(cluster_server)
    try:
        async with Queue(queues[0], redis_url=cluster_server.url) as q:
            await q.add_unique("f", 1, key="u")
        assert all(status(cluster_server.url)[i]["loaded"] for i in range(len(cluster_server.nodes)))
        with cluster_server.nodes[1].client() as r:  # e.g. a node new to the cluster
            _delete_library(r)
        for name in queues:
            async with Queue(name, redis_url=cluster_server.url) as q:
                await q.add_unique("f", 1, key="u")
                await q.add_bulk([{"name": "f", "data": i} for i in range(20)])
                assert q.driver._fn is True
            with SyncQueue(name, redis_url=cluster_server.url) as sq:
                sq.add_bulk([{"name": "f", "data": i} for i in range(20)])
                assert sq.driver._fn is True
        assert [r["loaded"] for r in status(cluster_server.url)] == [True] * len(cluster_server.nodes)
        assert _getkeys_calls(cluster_server) == getkeys_before  # FCALL's keys are read locally
        with cluster_server.client() as c:
            assert (
                sum(c.xlen(QueueKeys.for_queue(n).stream) for n in queues) == 12 * 41
            )  # the first queue's second add_unique was a duplicate
    finally:
        with cluster_server.client() as c:
            for n in queues:
                k = QueueKeys.for_queue(n)
                c.delete(k.stream, k.unique("u"))


def _getkeys_calls(cluster) -> int:
    total = 0
    for node in cluster.nodes:
        with node.client() as r:
            total += r.info("commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0)
    return total


@pytest.mark.timeout(90)
async def test_a_running_job_keeps_its_lease_at_maxmemory(tmp_path) -> None:
    """A job runs 4 s under a 1 s lease while the server is full (``maxmemory``, no eviction):
    the renewal function was refused there (a flagged function, while its EVALSHA twin ran),
    so the lease lapsed and the second worker reclaimed and ran the job again at once.  Renewal
    is ``allow-oom`` now: the job runs once, on one worker, and is acknowledged, still full; the
    refused heartbeats (``SET``) no longer crash the lease task in a loop."""
    server = start_server("redis7", tmpdir=tmp_path)
    runs: list[float] = []

    async def handler(job) -> str:
        runs.append(time.monotonic())
        await asyncio.sleep(4)
        return "done"

    try:
        with server.client() as r:
            async with Queue("full-lease", redis_url=server.url) as q:
                workers = [
                    Worker(
                        "full-lease",
                        handler,
                        redis_url=server.url,
                        run_scheduler=False,
                        claim_min_idle_ms=1000,
                        store_results=True,
                    )
                    for _ in range(2)
                ]
                tasks = [asyncio.create_task(w.run()) for w in workers]
                try:
                    job = await q.add("n", 1)
                    await wait_until(lambda: runs, 30, what="the job to start")
                    r.config_set("maxmemory-policy", "noeviction")
                    r.config_set("maxmemory", r.info("memory")["used_memory"] // 2)  # full from now on
                    with pytest.raises(Exception, match="maxmemory"):
                        await q.add("n", 2)
                    # the rest of its run (4 leases) and its ack at maxmemory (acks are allow-oom too)
                    assert await q.wait_for_result(job.id, timeout=30) == "done"
                    assert r.info("memory")["used_memory"] > int(r.config_get("maxmemory")["maxmemory"])
                    # a refused heartbeat is logged; it no longer crashed the lease task in a loop
                    assert [w.health()["lease"] for w in workers] == [True, True]
                finally:
                    r.config_set("maxmemory", 0)
                    for w in workers:
                        await w.close()
                    await asyncio.wait_for(asyncio.gather(*tasks), 30)
            assert len(runs) == 1, runs
    finally:
        server.stop()
