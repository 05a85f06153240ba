"""Concurrent plain adds share round trips (issue 27; ``engine/coalesce.py``, ``sync/coalesce.py``):
hundreds of tasks (or threads) adding one job at a time lose nothing, write each job once and in
each caller's order, cost Redis far fewer calls than jobs, and a lone add still goes at once.
A bad job fails its own caller only; a connection lost under a batch fails that batch's callers
and hangs nobody.  Real Redis servers."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections import defaultdict
from typing import Any

import pytest
import redis

from airflow_provider_chasqui import ConfigError, Queue, SyncQueue
from airflow_provider_chasqui.core.codec import decode_envelope
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.producer import ProducerCore

pytestmark = pytest.mark.timeout(180)


def _stream(url: str, queue: str) -> list[tuple[str, str, Any]]:
    """``(job id, name, data)`` of every entry, in stream order."""
    from airflow_provider_chasqui.core.codec import decode_data

    r = redis.Redis.from_url(url.split("?")[0])
    out = []
    for _eid, f in r.xrange(QueueKeys.for_queue(queue).stream):
        env = decode_envelope(f[b"d"])
        out.append((env.id, f.get(b"n", b"").decode(), decode_data(env.inner)))
    return out


def _calls(r: redis.Redis) -> tuple[int, int]:
    """``(XADDs, script calls)`` run so far (XADDs inside scripts count too; the scripts run as
    functions where the server has them, else by EVALSHA)."""
    stats = r.info("commandstats")
    scripts = sum(stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("evalsha", "eval", "fcall"))
    return stats.get("cmdstat_xadd", {}).get("calls", 0), scripts


@pytest.mark.single_node("INFO commandstats of one server")
async def test_hundreds_of_tasks_lose_nothing_and_share_round_trips(own_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(own_url)
    q = Queue(queue_name, redis_url=own_url)
    try:
        await q.add("warm", 0)  # the lone add: one XADD, at once
        before = _calls(r)
        got: dict[int, list[str]] = defaultdict(list)

        async def task(t: int) -> None:
            for i in range(20):
                job = await q.add(f"t{t}", {"t": t, "i": i})
                got[t].append(job.id)

        await asyncio.gather(*(task(t) for t in range(200)))
        xadds, batches = (a - b for a, b in zip(_calls(r), before))
        entries = _stream(own_url, queue_name)[1:]
        assert len(entries) == 4000 and len({e[0] for e in entries}) == 4000  # each job once
        by_id = {e[0]: e for e in entries}
        for t, ids in got.items():
            assert [by_id[j][2] for j in ids] == [{"t": t, "i": i} for i in range(20)]
            assert all(by_id[j][1] == f"t{t}" for j in ids)
            order = [e[0] for e in entries if e[1] == f"t{t}"]
            assert order == ids  # each caller's jobs in the order it added them
        assert xadds == 4000  # one XADD per job, inside the batch scripts or alone
        assert 1 <= batches <= 4000 / 20, batches  # shared: about one script call per round of the 200 tasks
        print(f"4,000 adds from 200 tasks: {batches} batch calls")
    finally:
        await q.close()


async def test_a_bad_job_fails_its_caller_only(redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url=redis_url, max_stream_len=10_000)
    try:
        huge = "x" * (2 * 1024 * 1024)
        results = await asyncio.gather(
            *(q.add("ok", i) for i in range(50)), q.add("big", huge), q.add(5, 1), return_exceptions=True
        )
        errors = [x for x in results if isinstance(x, BaseException)]
        assert len(errors) == 2 and all(isinstance(e, ConfigError) for e in errors), errors
        for job in results[:50]:  # every good job is there, waiting, with its data
            details = await q.get_job_details(job.id)  # type: ignore[union-attr]
            assert details.state == "waiting" and details.data == job.data  # type: ignore[union-attr]
    finally:
        await q.close()


@pytest.mark.single_node("kills the connection of one server")
async def test_a_lost_connection_fails_the_batch_and_hangs_nobody(own_url: str, queue_name: str) -> None:
    """Adds in flight when the server drops every client: each caller gets an answer (its job or
    a connection error) within the deadline, and adds made afterwards work."""
    r = redis.Redis.from_url(own_url)
    q = Queue(queue_name, redis_url=own_url)
    try:
        await q.add("warm", 0)

        async def many() -> list[Any]:
            return await asyncio.gather(*(q.add("n", i) for i in range(300)), return_exceptions=True)

        adding = asyncio.ensure_future(many())
        await asyncio.sleep(0)
        r.client_kill_filter(_type="normal", skipme=True)
        results = await asyncio.wait_for(adding, 60)
        ok = [x for x in results if not isinstance(x, BaseException)]
        failed = [x for x in results if isinstance(x, BaseException)]
        assert all(not isinstance(e, (AssertionError, asyncio.CancelledError)) for e in failed), failed
        ids = {e[0] for e in _stream(own_url, queue_name)}
        assert {j.id for j in ok} <= ids  # a job reported added is there
        assert (await q.add("after", 1)).id in {e[0] for e in _stream(own_url, queue_name)}
    finally:
        await q.close()


async def test_a_cancelled_waiting_caller_does_not_stall_the_others(redis_url: str, queue_name: str) -> None:
    q = Queue(queue_name, redis_url=redis_url)
    try:
        tasks = [asyncio.ensure_future(q.add("n", i)) for i in range(100)]
        await asyncio.sleep(0)
        for t in tasks[40:60]:
            t.cancel()
        done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)
        assert sum(not isinstance(x, BaseException) for x in done) >= 80
        assert (await asyncio.wait_for(q.add("after", 1), 30)).name == "after"
    finally:
        await q.close()


@pytest.mark.single_node("one server is enough: the calls are counted as the producer makes them")
async def test_tasks_adding_in_step_go_together_each_round(
    own_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 tasks adding in step: each round of their adds is two calls of about half the callers
    (``IN_FLIGHT``: one half at Redis while the other adds).  The add a caller makes while calls
    are out waits for the callers a call answers; sent at once it went alone, and the calls
    alternated sizes 1 and 99."""
    sizes: list[int] = []
    xadd_call, batch_call = ProducerCore.xadd_call, ProducerCore.batch_call
    monkeypatch.setattr(ProducerCore, "xadd_call", lambda self, e, n: (sizes.append(1), xadd_call(self, e, n))[1])
    monkeypatch.setattr(
        ProducerCore, "batch_call", lambda self, rows: (sizes.append(len(rows)), batch_call(self, rows))[1]
    )
    q = Queue(queue_name, redis_url=own_url)
    try:
        await q.add("warm", 0)
        sizes.clear()

        async def task(t: int) -> None:
            for i in range(20):
                await q.add(f"t{t}", {"t": t, "i": i})

        await asyncio.gather(*(task(t) for t in range(100)))
        assert sum(sizes) == 2000
        assert len(sizes) <= 2 * 20 + 10, sizes  # two calls per round of 100
        assert sorted(sizes)[len(sizes) // 2] >= 40, sizes  # halves (alternating 1 and 99: a median of 1)
        assert len(_stream(own_url, queue_name)) == 2001
    finally:
        await q.close()


@pytest.mark.single_node("INFO commandstats of one server")
def test_threads_sharing_a_syncqueue_share_round_trips(own_url: str, queue_name: str) -> None:
    r = redis.Redis.from_url(own_url)
    q = SyncQueue(queue_name, redis_url=own_url)
    try:
        q.add("warm", 0)
        before = _calls(r)
        got: dict[int, list[str]] = defaultdict(list)
        errors: list[BaseException] = []

        def thread(t: int) -> None:
            for i in range(200):
                if t == 3 and i == 100:
                    try:
                        q.add("big", "x" * (2 * 1024 * 1024))
                    except ConfigError as exc:
                        errors.append(exc)
                got[t].append(q.add(f"t{t}", {"t": t, "i": i}).id)

        threads = [threading.Thread(target=thread, args=(t,)) for t in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert not any(th.is_alive() for th in threads)
        assert len(errors) == 1  # the oversize job failed its own thread only
        entries = _stream(own_url, queue_name)[1:]
        assert len(entries) == 3200 and len({e[0] for e in entries}) == 3200
        for t, ids in got.items():
            assert [e[0] for e in entries if e[1] == f"t{t}"] == ids
        xadds, batches = (a - b for a, b in zip(_calls(r), before))
        assert xadds == 3200 and batches >= 1, (xadds, batches)  # some adds went together
        print(f"3,200 adds from 16 threads: {batches} batch calls")
    finally:
        q.close()


@pytest.mark.single_node("forks a process next to one server")
def test_a_child_forked_mid_add_adds_on_its_own(own_url: str, queue_name: str) -> None:
    """A process forked while another thread's add was in flight (a prefork server that made its
    SyncQueue early): the child's adds go out, they do not wait for the parent's call."""
    import os

    q = SyncQueue(queue_name, redis_url=own_url)
    try:
        q.add("warm", 0)
        q._adds._busy = True  # as if a thread's add were in flight at the fork
        pid = os.fork()
        if pid == 0:  # the child: its own add must not wait on the parent's call
            code = 1
            try:
                signal.alarm(30)  # a child stuck behind the parent's call dies, failing the test
                code = 0 if q.add("child", 1).id else 1  # the driver reconnects after a fork
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        q._adds._busy = False
        assert [e[1] for e in _stream(own_url, queue_name)] == ["warm", "child"]
    finally:
        q.close()


@pytest.mark.single_node("kills the connections of one server")
def test_threads_whose_batch_loses_its_connection_each_get_an_answer(own_url: str, queue_name: str) -> None:
    """16 threads adding while the server drops every client, again and again: each add returns
    its job (written once) or raises the connection error of the call that carried it; the
    threads woken in a chain all wake, none hangs, and adds work afterwards."""
    q = SyncQueue(queue_name, redis_url=own_url)
    q.add("warm", 0)
    added: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def adder(t: int) -> None:
        for i in range(150):
            try:
                added.append(q.add(f"t{t}", i).id)
            except Exception as exc:  # noqa: BLE001 - recorded and checked below
                errors.append(exc)

    def killer() -> None:
        with redis.Redis.from_url(own_url) as r:
            while not stop.wait(0.01):
                r.client_kill_filter(_type="normal", skipme=True)

    threads = [threading.Thread(target=adder, args=(t,)) for t in range(16)]
    chaos = threading.Thread(target=killer)
    try:
        chaos.start()
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert not any(th.is_alive() for th in threads)  # nobody left waiting on a chain
    finally:
        stop.set()
        chaos.join(30)
    assert len(added) + len(errors) == 16 * 150 and errors  # the kills did cut batches
    assert all(type(e).__name__ == "ChasquiConnectionError" for e in errors), {type(e) for e in errors}
    ids = [e[0] for e in _stream(own_url, queue_name)]
    assert len(ids) == len(set(ids))  # none written twice
    assert set(added) <= set(ids)  # every add that returned a job is there
    print(f"{len(added)} adds written, {len(errors)} failed with the connection")
    assert q.add("after", 1).name == "after"
    q.close()


class _Interrupted(Exception):
    pass


@pytest.mark.single_node("pauses one server's writes")
def test_a_thread_interrupted_while_it_waits_leaves_the_line_and_hangs_nobody(own_url: str, queue_name: str) -> None:
    """The main thread, waiting behind another thread's add (the server's writes paused), is
    interrupted (a signal handler raising, as Ctrl-C does): its add leaves the line unsent, and
    the threads adding after it all finish, their jobs written once each."""
    r = redis.Redis.from_url(own_url)
    q = SyncQueue(queue_name, redis_url=own_url)
    q.add("warm", 0)
    first = threading.Thread(target=q.add, args=("first", 1))
    previous = signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(_Interrupted()))
    try:
        r.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
        first.start()
        deadline = time.monotonic() + 30
        while not q._adds._busy:  # the first thread's add is out, held by the pause
            assert time.monotonic() < deadline
            time.sleep(0.005)
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(_Interrupted):
            q.add("main", 1)
        others = [threading.Thread(target=lambda t=t: [q.add(f"t{t}", i) for i in range(20)]) for t in range(4)]
        for th in others:
            th.start()
        for th in [first, *others]:
            th.join(60)
        assert not any(th.is_alive() for th in [first, *others])
        names = [e[1] for e in _stream(own_url, queue_name)]
        assert names.count("first") == 1 and "main" not in names  # interrupted before it was sent
        assert all(names.count(f"t{t}") == 20 for t in range(4)), names
        assert q.add("after", 1).name == "after"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        r.execute_command("CLIENT", "UNPAUSE")
        r.close()
        q.close()
