"""Least privilege: the runtime user of SECURITY.md (one queue's keys, FCALL of the loaded
library, no script commands) runs the producer, the worker (with its promoter and scheduler)
and the events reader, on database 0 and 3; the admin user of SECURITY.md installs the library.

The command list is derived from the source at test time (Python ``command(...)`` /
``execute_command(...)`` literals and ``args = ("CMD", ...)`` tuples, redis-py method calls on
clients, ``redis.call`` and table-built calls in the Lua scripts, and each script's FCALL or
FCALL_RO), so a new command in the code fails here until SECURITY.md grants it.  The end-to-end
runs apply SECURITY.md's lines as written.  After a run, ``ACL LOG`` must hold no denial:
nothing failed quietly (a swallowed CLIENT UNBLOCK, an event write).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import redis
from engine_support import wait_until
from servers import KINDS, start_server

from airflow_provider_chasqui import Queue, QueueEvents, RepeatPattern, SyncQueue, UnrecoverableError, Worker
from airflow_provider_chasqui.core.scripts import LIBRARY, SCRIPTS
from airflow_provider_chasqui.ops.functions import install

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_provider_chasqui"
CONTAINERS = {
    "ACL",
    "CLIENT",
    "CLUSTER",
    "COMMAND",
    "CONFIG",
    "FUNCTION",
    "MEMORY",
    "OBJECT",
    "SCRIPT",
    "XGROUP",
    "XINFO",
}
_PY_LITERAL = re.compile(
    r'\b(?:command|execute_command)\(\s*"([A-Z][A-Z0-9_]*)(?: ([A-Z][A-Z0-9-]*))?"'
    r'(?:\s*,\s*"([A-Z][A-Z0-9-]*)")?'
)
# args = ("XREADGROUP", ...) and return ("EVALSHA", ...)
_PY_TUPLE = re.compile(r'(?:\bargs\b[^=\n]*=|\breturn)\s*\(\s*"([A-Z][A-Z0-9_]+)"\s*,')
_PY_METHOD = re.compile(r"\b(?:pipe|client|_client|conn|r)\.([a-z][a-z_]*)\(")
_LUA = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'(?:\s*,\s*'([A-Za-z]+)')?|\{\s*'([A-Z][A-Z0-9]*)'")


# Sent by redis-py itself when it connects: CLIENT SETINFO (Redis >= 7.2; a denial is ignored by
# redis-py but lands in ACL LOG) and SELECT for a database other than 0.
HANDSHAKE = {"client|setinfo", "select"}
# The script path the runtime user does without: the EVALSHA fallback, and the admin's commands
# (a driver's own FUNCTION LOAD is an attempt that a denial ends; ``chasqui functions``).
FALLBACK = {"evalsha", "script|load"}
ADMIN = {"function|load", "function|list"}
# The operator's commands alone (``chasqui queues``, ``Queue.drain``/``obliterate``): SCAN finds
# queues and leftover keys, RENAME moves a queue's indexes aside, UNLINK frees big keys.
OPERATOR = {"scan", "rename", "unlink"}
SCRIPT_COMMANDS = ("eval", "eval_ro", "evalsha", "evalsha_ro", "script", "function")


def commands_in_code(known: set[str] | None = None) -> set[str]:
    """ACL names (``xadd``, ``client|id``) of every command the package and its Lua send.

    ``known``: the server's command names, to tell redis-py method calls (``pipe.xlen``) from
    other methods; without it only literals are read.
    """
    out: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for cmd, sub_inline, sub_arg in _PY_LITERAL.findall(text):
            sub = sub_inline or sub_arg
            out.add(f"{cmd}|{sub}".lower() if cmd in CONTAINERS and sub else cmd.lower())
        out.update(
            c.lower() for c in _PY_TUPLE.findall(text) if c not in CONTAINERS and (known is None or c.lower() in known)
        )
        if known is not None:
            out.update(m for m in _PY_METHOD.findall(text) if m in known and m.upper() not in CONTAINERS)
    for path in (ROOT / "lua").rglob("*.lua"):
        for a, sub, b in _LUA.findall(path.read_text()):
            cmd = (a or b).upper()
            out.add(f"{cmd}|{sub}".lower() if cmd in CONTAINERS and sub else cmd.lower())
    out.update(s.fcall.lower() for s in SCRIPTS.values())
    return out


def runtime_commands(known: set[str] | None = None) -> set[str]:
    """What the runtime user needs: the code's commands less the script path's, plus the handshake."""
    return (commands_in_code(known) - FALLBACK - ADMIN - OPERATOR) | HANDSHAKE


def acl_line(marker: str = "acl") -> list[str]:
    """The ``ACL SETUSER`` arguments between SECURITY.md's ``<!-- {marker}-begin -->`` markers."""
    text = (ROOT / "SECURITY.md").read_text()
    block = text.split(f"<!-- {marker}-begin -->", 1)[1].split(f"<!-- {marker}-end -->", 1)[0]
    tokens = block.replace("```", " ").split()
    assert tokens[:3] == ["ACL", "SETUSER", tokens[2]], tokens[:3]
    return tokens[2:]


def documented_commands(marker: str = "acl") -> set[str]:
    return {tok[1:].lower() for tok in acl_line(marker) if tok.startswith("+")}


def test_code_derivation_sees_the_known_commands() -> None:
    found = commands_in_code()
    assert {
        "evalsha",
        "script|load",
        "fcall",
        "fcall_ro",
        "function|load",
        "xreadgroup",
        "xack",
        "xdel",
        "xclaim",
        "xpending",
        "client|id",
        "client|unblock",
        "command|info",
        "xgroup|create",
        "xadd",
        "zadd",
        "time",
    } <= found, found


def test_security_md_grants_every_command_the_code_sends(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url, socket_timeout=5) as r:  # its command table, for method calls
        known = {c.decode().lower() for c in r.execute_command("COMMAND LIST")} | {"xackdel"}
    missing = runtime_commands(known) - documented_commands()
    assert not missing, f"SECURITY.md's ACL line lacks {sorted(missing)}; add them between the acl markers"
    line = acl_line()
    granted_scripts = {c for c in documented_commands() if c.split("|")[0] in SCRIPT_COMMANDS}
    assert not granted_scripts, f"the runtime user must run no script command: {granted_scripts}"
    assert all(f"-{c}" in line for c in SCRIPT_COMMANDS), line  # explicit, should a later rule widen it
    assert documented_commands("acl-admin") >= ADMIN | HANDSHAKE
    assert documented_commands("acl-operator") == OPERATOR  # granted on top of the runtime line


def _setuser(
    admin: redis.Redis, marker: str, name: str, password: str, queue: str, swap: dict[str, str] | None = None
) -> None:
    """SECURITY.md's line for ``marker`` as written, for ``queue``, less the commands this server
    lacks (as its notes say); ``swap`` replaces tokens (the script-grant variant)."""
    args = []
    for tok in acl_line(marker)[1:]:
        tok = (swap or {}).get(tok, tok)
        if not tok:
            continue
        if tok.startswith(">"):
            tok = ">" + password
        elif tok.startswith("~"):
            tok = tok.replace("emails", queue)
        elif tok[0] in "+-" and tok[1] != "@" and not admin.execute_command("COMMAND INFO", tok[1:])[0]:
            continue  # xackdel before 8.2, client|setinfo before 7.2, eval_ro before 7.0
        args.append(tok)
    admin.execute_command("ACL", "SETUSER", name, *args)


def _script_stats(admin: redis.Redis) -> dict[str, int]:
    stats = admin.info("commandstats")
    return {
        k[len("cmdstat_") :]: v["calls"]
        for k, v in stats.items()
        if k[len("cmdstat_") :].split("|")[0] in SCRIPT_COMMANDS + ("fcall", "fcall_ro")
    }


async def _workload(url: str, queue: str) -> None:
    """Producer, worker (complete, retry, DLQ, replay), promoter, scheduler, events, SyncQueue."""
    ran: list[str] = []

    async def ok(job) -> dict:
        ran.append(job.name)
        return {"echo": job.data}

    async def boom(job) -> None:
        raise UnrecoverableError("always")

    async def flaky(job) -> None:
        if job.attempt == 0:
            raise RuntimeError("first attempt fails, the retry succeeds")
        ran.append("flaky")

    async with Queue(queue, redis_url=url) as q:
        job = await q.add("ok", {"n": 1})
        await q.add_bulk([{"name": "ok", "data": {"n": i}} for i in range(50)])
        await q.add_bulk([{"name": "ok", "data": {"n": "bulk-later"}, "delay": 30}])
        await q.add("ok", {"n": "later"}, delay_ms=50, job_id="delayed-1")
        await q.add("ok", {"n": "cancelled"}, delay_ms=60_000, job_id="delayed-2")
        assert await q.cancel_delayed("delayed-2")
        await q.add_unique("ok", {"n": "u"}, key="u1")
        await q.add("boom", {})
        await q.add("flaky", {}, backoff=10)
        await q.upsert_repeatable_job("ok", {"n": "cron"}, repeat=RepeatPattern.every(200), key="every-200")
        events = QueueEvents(queue, redis_url=url, last_event_id="0-0", block_ms=200)
        worker = Worker(
            queue,
            {"ok": ok, "boom": boom, "flaky": flaky},
            redis_url=url,
            store_results=True,
            run_scheduler=True,
            scheduler_tick_ms=50,
            promoter_poll_ms=20,
            claim_min_idle_ms=1000,
        )
        task = asyncio.create_task(worker.run())
        try:
            assert await q.wait_for_result(job.id, timeout=30) == {"echo": {"n": 1}}
            await wait_until(
                lambda: ran.count("ok") >= 55 + 2 and "flaky" in ran,
                30,
                what="plain, bulk, delayed, unique, flaky and two scheduled fires to run",
            )
            dead = await wait_until(q.peek_dlq, 30, what="the unrecoverable job in the DLQ")
            assert dead[0]["reason"] == "unrecoverable"
            assert await q.get_job_state(job.id) == "completed"
            seen = []
            async for ev in events:
                seen.append(ev.name)
                if "completed" in seen and "dlq" in seen:
                    break
            assert await q.replay_dlq() == 1
            assert await q.remove_repeatable_by_key("every-200")
        finally:
            await worker.close()
            await asyncio.wait_for(task, 30)
            await events.close()
    with SyncQueue(queue, redis_url=url) as sq:  # the blocking twin used by Airflow operators
        sq.add("ok", {"n": "sync"})
        sq.add_bulk([{"name": "ok", "data": {"n": "sync-bulk"}}, {"name": "ok", "data": 1, "delay": 60_000}])
        sq.add_unique("ok", {"n": "sync-u"}, key="u2")
        assert sq.get_job_state("nope") == "unknown"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("db", [0, 3])
@pytest.mark.parametrize("kind", KINDS)
async def test_least_privilege_user_runs_on_functions_only(kind: str, db: int, tmp_path) -> None:
    server = start_server(kind, tmpdir=tmp_path)
    queue, other = "acl-q", "acl-other"
    try:
        with server.client() as admin:
            _setuser(admin, "acl", "chasqui", "s3cret-pw", queue)
            _setuser(admin, "acl-admin", "chasqui-admin", "adm1n-pw", queue)
            admin.execute_command("ACL", "LOG", "RESET")
            admin.execute_command("CONFIG", "RESETSTAT")
        # the admin user of SECURITY.md installs the library (the URL's db does not matter)
        rows = install(f"redis://chasqui-admin:adm1n-pw@127.0.0.1:{server.port}/{db}")
        assert [r["outcome"] for r in rows] == ["loaded"]
        url = f"redis://chasqui:s3cret-pw@127.0.0.1:{server.port}/{db}"

        await _workload(url, queue)

        with server.client() as admin:
            denials = admin.execute_command("ACL", "LOG")
            stats = _script_stats(admin)
            in_db = admin.execute_command("SELECT", db) and admin.exists(f"{{chasqui:{queue}}}:stream")
        assert not denials, f"the ACL user was denied during a normal run: {denials}"
        assert in_db, f"the queue's keys are not in database {db}"
        assert set(stats) <= {"fcall", "fcall_ro", "function|load"}, stats  # no EVAL, EVALSHA, SCRIPT
        assert stats["fcall"] > 0 and stats["fcall_ro"] > 0, stats

        # What the user must not do: run Lua of its own (the issue: a CPU loop blocked other
        # clients), other queues' keys, other keys, admin and dangerous commands.
        loop = "local n = 0 while true do n = n + 1 end"
        with redis.Redis.from_url(url, socket_timeout=5) as user:
            for args in (
                ("EVAL", loop, "0"),
                ("EVALSHA", SCRIPTS["promote"].sha, "0"),
                ("SCRIPT", "LOAD", loop),
                ("FUNCTION", "LOAD", f"#!lua name=evil\nredis.register_function('evil', function() {loop} end)"),
                ("FUNCTION", "DELETE", LIBRARY.name),
                ("FUNCTION", "FLUSH"),
                ("SCRIPT", "FLUSH"),
                ("GET", "unrelated"),
                ("SET", f"{{chasqui:{other}}}:stream", "x"),
                ("FLUSHALL",),
                ("KEYS", "*"),
                ("CONFIG", "GET", "*"),
                ("ACL", "WHOAMI"),
                ("CLIENT", "KILL", "TYPE", "normal"),
                ("SCAN", "0"),
                ("XGROUP", "DESTROY", f"{{chasqui:{queue}}}:stream", "default"),
            ):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    user.execute_command(*args)
            with pytest.raises(redis.exceptions.ResponseError, match="Function not found"):
                user.execute_command("FCALL", "evil", "0")  # nothing of the user's was loaded
        async with Queue(other, redis_url=url) as foreign:
            with pytest.raises(Exception, match="(?i)no permissions"):
                await foreign.add("ok", {})
    finally:
        server.stop()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("kind", KINDS)
async def test_script_grant_still_works_without_the_library(kind: str, tmp_path, monkeypatch) -> None:
    """SECURITY.md's fallback: no library, ``+evalsha +script|load`` instead of FCALL, and
    ``CHASQUI_FUNCTIONS=off``: the same workload runs on EVALSHA with an empty ACL LOG."""
    monkeypatch.setenv("CHASQUI_FUNCTIONS", "off")
    server = start_server(kind, tmpdir=tmp_path)
    queue = "acl-fallback"
    try:
        with server.client() as admin:
            _setuser(
                admin,
                "acl",
                "chasqui",
                "s3cret-pw",
                queue,
                swap={"+fcall": "+evalsha", "+fcall_ro": "+script|load", "-evalsha": "", "-script": ""},
            )
            admin.execute_command("ACL", "LOG", "RESET")
            admin.execute_command("CONFIG", "RESETSTAT")
        await _workload(f"redis://chasqui:s3cret-pw@127.0.0.1:{server.port}/0", queue)
        with server.client() as admin:
            denials = admin.execute_command("ACL", "LOG")
            stats = _script_stats(admin)
            libraries = admin.execute_command("FUNCTION", "LIST")
        assert not denials, f"the ACL user was denied during a normal run: {denials}"
        assert set(stats) == {"evalsha", "script|load"} and stats["evalsha"] > 0, stats
        assert libraries == []
    finally:
        server.stop()
