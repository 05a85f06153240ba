"""The scheduler race of issue #8: five scheduler processes, the leader SIGKILLed again and
again for a minute (``CHASQUI_KILL_SECONDS``) over 1,000 every-second specs; no window fires
twice, none is missing.

Five real ``sched_proc.py`` processes (standard leader locking: the ``:scheduler:lock`` key,
TTL 5 s) run on a Redis 7 server of the test's own, so nothing else trims, flushes or loads
it.  Every few seconds the test reads the lock's holder, lets it lead a random 0.15-2.5 s
(four times in ten only 0-0.15 s: the kill then lands in the catch-up tick of a fresh leader,
which fires ~6,000 missed windows in about 0.1 s), SIGKILLs it and starts a replacement, so
five stay alive.  A dead leader's lock lapses only after its TTL, so each kill leaves the
queue leaderless for 5-6 s: the specs use ``fire_all(1000)``, and every window that fell due
meanwhile must be fired late, as catch-up, exactly once.  After a kill that hit a leader
still catching up, the next leader is let catch up before it is killed, so the lag the test
allows never depends on the luck of the draw.

Checked afterwards from the stream (XRANGE; the stream's MAXLEN is 1M and XINFO's
``entries-added`` proves nothing was trimmed): no fire id twice; per spec the fires are
exactly its windows from its first to the one before its current score (the next unfired
window), in 1 s steps, and its ``fired`` counter agrees; nothing went to the delayed set;
every fire's lag stays within a generous bound and every spec was still being fired when
the schedulers were stopped.  The figures (kills, fires, lag percentiles, CPU per fire of
the schedulers and of Redis) are printed; run with ``-s`` to see them.

The second test covers the one way a live leader could stall the schedule: its lock renewals
succeed while its ticks fail; it must hand the lock over (``engine/leader.py``).
"""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
from engine_support import wait_until_sync
from servers import free_port, start_server

from airflow_provider_chasqui import MissedFiresPolicy, RepeatPattern, SyncQueue
from airflow_provider_chasqui.core.keys import QueueKeys

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))
from sched_support import Fire, fires, spawn_scheduler, stop_proc, wait_ready

# the run's length: CI runs one minute (about seven kills); CHASQUI_KILL_SECONDS=600 for a long one
RUN_S = float(os.environ.get("CHASQUI_KILL_SECONDS", "60"))
pytestmark = [pytest.mark.timeout(300 + 2 * int(RUN_S)), pytest.mark.slow]

SPECS = 1000
SCHEDULERS = 5
KILL_GAP_S = (3.0, 6.0)  # at least this long between kills (a takeover itself takes ~TTL)
LEAD_S = (0.15, 2.5)  # how long a new leader leads before it is killed (or 0-0.15 s: mid catch-up)
POLICY = MissedFiresPolicy.fire_all(1000)  # far above the ~7 windows a takeover misses
LAG_BOUND_MS = 30_000  # two takeovers back to back (~11 s, seen: 10.7 s); the rest is CI slack
MIN_KILLS = 8  # 18-20 happen on a quiet machine
CAUGHT_UP_MS = 3000  # no spec later than this: the leader has caught up


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def cpu_of_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def upsert_specs(url: str, queue: str, n: int) -> list[int]:
    """``n`` every-1 s specs (data = their index) with phases spread over one second; returns
    their first fires."""
    t0 = now_ms()
    with SyncQueue(queue, redis_url=url) as q:
        q.upsert_repeatable_bulk(
            [
                {
                    "name": "race",
                    "data": i,
                    "key": f"s{i:04}",
                    "repeat": RepeatPattern.every(1000),
                    "start_after_ms": t0 + 1000 + i * (1000 // n),
                    "missed_fires": POLICY,
                }
                for i in range(n)
            ]
        )
    with redis.Redis.from_url(url) as r, r.pipeline(transaction=False) as p:
        for i in range(n):
            p.zscore(QueueKeys.for_queue(queue).repeat, f"s{i:04}")
        return [int(s) for s in p.execute()]


def check_every_window_fired_once(r: redis.Redis, queue: str, firsts: list[int]) -> tuple[list[Fire], list[int]]:
    """Once the schedulers are stopped: the stream holds every window of every spec, from its
    first fire up to its current score (the next window, not fired yet), each exactly once,
    and the specs' ``fired`` counters agree.  Returns the fires and the specs' next windows."""
    keys = QueueKeys.for_queue(queue)
    got = fires(r, queue)
    info = r.xinfo_stream(keys.stream)
    added = info.get("entries-added", info.get(b"entries-added"))
    assert added == len(got) == r.xlen(keys.stream), "the stream was trimmed: fires would be lost"
    assert r.zcard(keys.delayed) == 0, "a fire went to the delayed set (no promoter runs here)"
    dups = [jid for jid, c in Counter(f.envelope.id for f in got).items() if c > 1]
    assert not dups, f"{len(dups)} fire ids appear twice, e.g. {dups[:3]}"
    per: dict[int, list[int]] = defaultdict(list)
    for f in got:
        assert f.name == "race"
        per[msgpack.unpackb(f.envelope.inner)].append(f.scheduled_ms)
    n = len(firsts)
    with r.pipeline(transaction=False) as p:
        for i in range(n):
            p.zscore(keys.repeat, f"s{i:04}")
            p.hget(keys.repeat_spec(f"s{i:04}"), "fired")
        raw = p.execute()
    nexts, counters = [int(s) for s in raw[0::2]], [int(c or 0) for c in raw[1::2]]
    assert sorted(per) == list(range(n)), "a spec never fired"
    bad = []
    for i in range(n):
        times = sorted(per[i])
        if times != list(range(firsts[i], nexts[i], 1000)) or counters[i] != len(times):
            want = set(range(firsts[i], nexts[i], 1000))
            bad.append(
                (
                    i,
                    f"missing {sorted(want - set(times))[:5]}",
                    f"extra {sorted(set(times) - want)[:5]}",
                    f"counter {counters[i]} vs {len(times)} fires",
                )
            )
    assert not bad, f"{len(bad)} specs with a gap or a stray fire: {bad[:5]}"
    return got, nexts


def test_five_schedulers_with_the_leader_killed_fire_every_window_exactly_once(tmp_path: Path) -> None:
    seed = int(os.environ.get("CHASQUI_KILL_SEED", time.time_ns() % 2**32))
    rng = random.Random(seed)
    queue = f"t-{uuid.uuid4().hex[:8]}"
    keys = QueueKeys.for_queue(queue)
    # verbose: the server logs why it closed a connection (a protocol error, say)
    server = start_server("redis7", tmpdir=tmp_path, extra_args=("--loglevel", "verbose"))
    procs: dict[str, subprocess.Popen[bytes]] = {}  # holder -> live process
    log = open(tmp_path / "schedulers.log", "ab")  # noqa: SIM115 - closed in the finally; every process's log lines
    r: redis.Redis | None = None
    try:
        r = server.client(socket_timeout=60)
        firsts = upsert_specs(server.url, queue, SPECS)
        cpu0, rcpu0 = cpu_of_children(), redis_cpu(r)

        def spawn() -> None:
            proc = spawn_scheduler(server.url, queue, "--log-level", "INFO", log=log)
            procs[wait_ready(proc, timeout=60)] = proc

        def live_leader() -> str | None:
            holder = r.get(keys.scheduler_lock)
            h = holder.decode() if holder else None
            return h if h in procs and procs[h].poll() is None else None

        def story() -> str:
            """The last log lines of the schedulers and of the server: why a run went wrong."""
            log.flush()
            lines = (tmp_path / "schedulers.log").read_text(errors="replace").splitlines()
            noisy = ("Accepted", "Client closed connection", "DB 0:")
            srv = [ln for ln in server.log_tail(400).splitlines() if not any(n in ln for n in noisy)]
            return "schedulers:\n" + "\n".join(lines[-15:]) + "\nserver:\n" + "\n".join(srv[-10:])

        def overdue() -> bool:
            """Some spec is over CAUGHT_UP_MS late: nobody leads, or the leader is catching up."""
            return bool(r.zrangebyscore(keys.repeat, "-inf", now_ms() - CAUGHT_UP_MS, start=0, num=1))

        def waited(cond: Callable[[], Any], timeout: float, what: str) -> Any:
            try:
                return wait_until_sync(cond, timeout, what=what)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n{story()}") from None

        for _ in range(SCHEDULERS):
            spawn()
        started = time.monotonic()
        end = started + RUN_S
        last_kill = started
        kills: list[tuple[float, float, bool]] = []  # (s into the run, s it led, killed while catching up)
        behind = False  # the last kill hit a leader still catching up
        while True:
            leader = waited(live_leader, 60, "a live scheduler holding the lock")
            if behind:  # never two catch-up kills in a row: the lag a test allows stays bounded
                waited(lambda: time.monotonic() >= end or not overdue(), 90, "the new leader to catch up")
            seen = time.monotonic()
            if seen >= end:
                break
            lead = rng.uniform(0.0, 0.15) if rng.random() < 0.4 else rng.uniform(*LEAD_S)
            kill_at = min(end, max(last_kill + rng.uniform(*KILL_GAP_S), seen + lead))
            # the pacing of the fault, not a synchronisation: wait for the chosen instant
            wait_until_sync(lambda kill_at=kill_at: time.monotonic() >= kill_at, RUN_S + 60, what="the kill instant")
            if time.monotonic() >= end:
                break
            behind = overdue()
            proc = procs.pop(leader)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            assert proc.returncode == -signal.SIGKILL
            holder = r.get(keys.scheduler_lock)  # still the dead one's: it did lead when killed
            if holder is not None and holder.decode() == leader:
                last_kill = time.monotonic()
                kills.append((round(last_kill - started, 1), round(last_kill - seen, 2), behind))
            stop_proc(proc)  # closes its pipe; it already exited
            spawn()
        stop_begin = now_ms()
        leader_at_end = live_leader()
        # the followers first, then the leader, so no follower takes over for a last tick
        order = sorted(procs, key=lambda h: h == leader_at_end)
        results = {h: stop_proc(procs.pop(h)) for h in order}
        assert {h: code for h, (code, _) in results.items()} == dict.fromkeys(results, 0)
        elapsed = time.monotonic() - started
        sched_cpu = cpu_of_children() - cpu0
        rcpu = redis_cpu(r) - rcpu0

        got, nexts = check_every_window_fired_once(r, queue, firsts)
        stalled = [i for i in range(SPECS) if nexts[i] < stop_begin - LAG_BOUND_MS]
        assert not stalled, f"specs no longer fired at the end: {stalled[:10]}\n{story()}"
        lags = sorted(f.entry_ms - f.scheduled_ms for f in got)
        catchup = sum(lag >= 1000 for lag in lags)
        mid = sum(k[2] for k in kills)
        figures = (
            f"seed={seed} kills={len(kills)} ({mid} mid catch-up) in {elapsed:.0f}s fires={len(got)} "
            f"catch-up fires (lag>=1s)={catchup} lag p50={lags[len(lags) // 2]}ms "
            f"p99={lags[len(lags) * 99 // 100]}ms max={lags[-1]}ms "
            f"scheduler CPU={sched_cpu:.1f}s ({sched_cpu / len(got) * 1e6:.0f}us/fire) "
            f"redis CPU={rcpu:.1f}s ({rcpu / len(got) * 1e6:.0f}us/fire)"
        )
        print(f"\n{figures}\nkills (s into the run, s it led, mid catch-up): {kills}")
        (tmp_path / "figures.txt").write_text(figures + "\n")
        assert len(kills) >= MIN_KILLS, f"{figures}\n{story()}"
        assert lags[-1] <= LAG_BOUND_MS, f"{figures}\n{story()}"
        assert len(got) >= SPECS * (RUN_S - LAG_BOUND_MS / 1000), f"{figures}\n{story()}"
    finally:
        for proc in procs.values():
            stop_proc(proc)
        log.close()
        if r is not None:
            r.close()
        server.stop()


def test_a_leader_whose_ticks_keep_failing_hands_the_lock_over(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """A leader that renews its lock but cannot fire (its firing connection points at a dead
    port) releases the lock after one TTL of failed ticks; a healthy process takes over and
    fires every window, late ones as catch-up, exactly once."""
    n = 20
    keys = QueueKeys.for_queue(queue_name)
    firsts = upsert_specs(redis_url, queue_name, n)
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there: every tick is refused
    log_path = tmp_path / "schedulers.log"
    procs: list[subprocess.Popen[bytes]] = []
    with open(log_path, "ab") as log, redis.Redis.from_url(redis_url) as r:
        try:
            procs.append(spawn_scheduler(redis_url, queue_name, "--fire-url", dead, "--log-level", "INFO", log=log))
            broken = wait_ready(procs[0], timeout=60)
            wait_until_sync(lambda: r.get(keys.scheduler_lock) == broken.encode(), 60, what="the broken one leads")
            procs.append(spawn_scheduler(redis_url, queue_name, "--log-level", "INFO", log=log))
            healthy = wait_ready(procs[1], timeout=60)
            started = time.monotonic()
            wait_until_sync(
                lambda: r.get(keys.scheduler_lock) == healthy.encode(),
                60,
                what=f"the healthy one to take the lock over\n{log_path.read_text()}",
            )
            took = time.monotonic() - started
            # it catches up, and keeps the lock once the broken one's time out is over
            handed_at = now_ms()
            wait_until_sync(
                lambda: not r.zrangebyscore(keys.repeat, "-inf", handed_at, start=0, num=1),
                60,
                what="the healthy leader to fire the windows missed meanwhile",
            )
            wait_until_sync(lambda: b"stays out" in log_path.read_bytes(), 30, what="the step-down logged")
            back = now_ms() + 5000 + 2000  # the broken one's time out (one TTL), then a refused try
            wait_until_sync(lambda: now_ms() >= back, 30, what="the broken one to ask again")
            assert r.get(keys.scheduler_lock) == healthy.encode()
        finally:
            results = [stop_proc(p) for p in procs]
        assert [code for code, _ in results] == [0, 0], log_path.read_text()
        (_, broken_stats), (_, healthy_stats) = results
        assert broken_stats["fired"] == 0 and broken_stats["ticks"] == 0
        got, _ = check_every_window_fired_once(r, queue_name, firsts)
        assert healthy_stats["fired"] == len(got) > 0
    print(f"\nhealthy scheduler took the lock over {took:.1f}s after it started; {len(got)} fires")
    assert took <= 5 + 5 + 10, took  # one TTL of failures (+ the backoff in it) + one interval, with slack
