"""Least privilege: an ACL user limited to one queue's keys and the commands the code uses
runs the producer, the worker (with its promoter and scheduler) and the events reader.

The command list is derived from the source at test time (Python ``command(...)`` /
``execute_command(...)`` literals, redis-py method calls on clients, ``redis.call`` and
table-built calls in the Lua scripts), so a new command in the code fails here until it is
granted, and ``SECURITY.md`` must list every one of them.  After the run, ``ACL LOG`` must
hold no denial: nothing failed quietly (a swallowed CLIENT UNBLOCK, an event write).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
import redis

from airflow_provider_chasqui import Queue, QueueEvents, RepeatPattern, SyncQueue, UnrecoverableError, Worker
from engine_support import wait_until
from servers import KINDS, start_server

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "airflow_provider_chasqui"
CONTAINERS = {"ACL", "CLIENT", "CLUSTER", "COMMAND", "CONFIG", "FUNCTION", "MEMORY", "OBJECT", "SCRIPT", "XGROUP",
              "XINFO"}
_PY_LITERAL = re.compile(r'\b(?:command|execute_command)\(\s*"([A-Z][A-Z0-9]*)(?: ([A-Z][A-Z0-9-]*))?"'
                         r'(?:\s*,\s*"([A-Z][A-Z0-9-]*)")?')
_PY_TUPLE = re.compile(r'\bargs\b[^=\n]*=\s*\(\s*"([A-Z][A-Z0-9]+)"\s*,')  # args = ("XREADGROUP", ...)
_PY_METHOD = re.compile(r"\b(?:pipe|client|_client|conn|r)\.([a-z][a-z_]*)\(")
_LUA = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'|\{\s*'([A-Z][A-Z0-9]*)'")


# Sent by redis-py itself when it connects (Redis >= 7.2); a denial is ignored by redis-py but
# lands in ACL LOG, so SECURITY.md grants it too.
HANDSHAKE = {"client|setinfo"}


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
        out.update(c.lower() for c in _PY_TUPLE.findall(text)
                   if c not in CONTAINERS and (known is None or c.lower() in known))
        if known is not None:
            out.update(m for m in _PY_METHOD.findall(text) if m in known and m.upper() not in CONTAINERS)
    for path in (ROOT / "lua").glob("*.lua"):
        for a, b in _LUA.findall(path.read_text()):
            out.add((a or b).lower())
    return out


def documented_commands() -> set[str]:
    """The ``+command`` grants in SECURITY.md's ACL block."""
    text = (ROOT / "SECURITY.md").read_text()
    block = text.split("<!-- acl-begin -->", 1)[1].split("<!-- acl-end -->", 1)[0]
    return {tok[1:].lower() for tok in block.split() if tok.startswith("+")}


def test_code_derivation_sees_the_known_commands() -> None:
    found = commands_in_code()
    assert {"evalsha", "script|load", "xreadgroup", "xack", "xdel", "xclaim", "xpending", "client|id",
            "client|unblock", "command|info", "xgroup|create", "xadd", "zadd", "time"} <= found, found


def test_security_md_grants_every_command_the_code_sends(redis_url: str) -> None:
    with redis.Redis.from_url(redis_url, socket_timeout=5) as r:  # its command table, for method calls
        known = {c.decode().lower() for c in r.execute_command("COMMAND LIST")} | {"xackdel"}
    missing = (commands_in_code(known) | HANDSHAKE) - documented_commands()
    assert not missing, f"SECURITY.md's ACL line lacks {sorted(missing)}; add them between the acl markers"


def _known_commands(r: redis.Redis) -> set[str]:
    return {c.decode().lower() for c in r.execute_command("COMMAND LIST")}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
async def test_least_privilege_user_runs_producer_worker_scheduler(kind: str, tmp_path) -> None:
    server = start_server(kind, tmpdir=tmp_path)
    queue, other = "acl-q", "acl-other"
    try:
        with server.client() as admin:
            known = _known_commands(admin)
            grants = sorted(c for c in commands_in_code(known) | HANDSHAKE
                            if c.split("|")[0] in known and admin.execute_command("COMMAND INFO", c)[0])
            admin.execute_command("ACL", "SETUSER", "chasqui", "reset", "on", ">s3cret-pw",
                                  f"~{{chasqui:{queue}}}*", "resetchannels", "-@all", *("+" + c for c in grants))
            admin.execute_command("ACL", "LOG", "RESET")
        url = f"redis://chasqui:s3cret-pw@127.0.0.1:{server.port}/0"
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
            await q.add("ok", {"n": "later"}, delay_ms=50, job_id="delayed-1")
            await q.add("ok", {"n": "cancelled"}, delay_ms=60_000, job_id="delayed-2")
            assert await q.cancel_delayed("delayed-2")
            await q.add_unique("ok", {"n": "u"}, key="u1")
            await q.add("boom", {})
            await q.add("flaky", {}, backoff=10)
            await q.upsert_repeatable_job("ok", {"n": "cron"}, repeat=RepeatPattern.every(200), key="every-200")
            events = QueueEvents(queue, redis_url=url, last_event_id="0-0", block_ms=200)
            worker = Worker(queue, {"ok": ok, "boom": boom, "flaky": flaky}, redis_url=url, store_results=True,
                            run_scheduler=True, scheduler_tick_ms=50, promoter_poll_ms=20, claim_min_idle_ms=1000)
            task = asyncio.create_task(worker.run())
            try:
                assert await q.wait_for_result(job.id, timeout=30) == {"echo": {"n": 1}}
                await wait_until(lambda: ran.count("ok") >= 54 + 2 and "flaky" in ran, 30,
                                 what="plain, delayed, unique, flaky and two scheduled fires to run")
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
            assert sq.get_job_state("nope") == "unknown"

        with server.client() as admin:
            denials = admin.execute_command("ACL", "LOG")
        assert not denials, f"the ACL user was denied during a normal run: {denials}"

        # What the user must not do: other queues' keys, other keys, admin and dangerous commands.
        with redis.Redis.from_url(url, socket_timeout=5) as user:
            for args in (("GET", "unrelated"), ("SET", f"{{chasqui:{other}}}:stream", "x"), ("FLUSHALL",),
                         ("KEYS", "*"), ("CONFIG", "GET", "*"), ("EVAL", "return 1", "0"), ("ACL", "WHOAMI"),
                         ("CLIENT", "KILL", "TYPE", "normal"), ("SCRIPT", "FLUSH"), ("SCAN", "0"),
                         ("XGROUP", "DESTROY", f"{{chasqui:{queue}}}:stream", "default")):
                with pytest.raises(redis.exceptions.NoPermissionError):
                    user.execute_command(*args)
        async with Queue(other, redis_url=url) as foreign:
            with pytest.raises(Exception, match="(?i)no permissions"):
                await foreign.add("ok", {})
    finally:
        server.stop()
    print(f"\n[acl {kind}] granted {len(grants)} commands: {' '.join(grants)}")
