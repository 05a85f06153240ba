"""Worker identity and liveness (issue 28, ``core/liveness.py``) on Redis 7.0, where
``XINFO CONSUMERS``' ``idle`` counts from a consumer's last *successful* read: a healthy worker
waiting on an empty queue looks as idle as a dead one.  Before heartbeats, an idle worker's
own janitor removed its consumer after 10 leases, and every viewer then showed 0 consumers.

Real worker processes (``fault_support.py worker``) with a 1 s lease (the janitor's reap age
is 10 s and it sweeps every 5 s); what every viewer reads is ``core/inspect.snapshot``.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from engine_support import wait_until_sync
from fault_support import spawn_worker

from airflow_provider_chasqui import SyncQueue
from airflow_provider_chasqui.core.calls import command
from airflow_provider_chasqui.core.codec import now_ms
from airflow_provider_chasqui.core.inspect import snapshot
from airflow_provider_chasqui.engine.identity import consumer_name

LEASE_MS = 1000
IDLE_LEASES = 30  # three times the reap age


def _snap(q: SyncQueue):
    return q.driver.run(snapshot(q.name, now_ms=now_ms()))


def _both_beat(q: SyncQueue, names: list[str]) -> bool:
    s = _snap(q)
    return {c.name for c in s.consumers} == set(names) and all(c.live for c in s.consumers)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("compat_mode", [False], indirect=True)
@pytest.mark.parametrize("server_matrix", ["redis7"], indirect=True)
def test_an_idle_worker_stays_listed_and_a_killed_one_goes_within_two_leases(
    matrix_url, queue_name: str, tmp_path: Path
) -> None:
    """Two idle workers stay listed and alive for 30 leases (3x the reap age), sampled every
    half lease; one is SIGKILLed and counts as gone within two leases, and its consumer is
    reaped by the other within 10 + 5 leases more, the live one staying."""
    url = matrix_url.url
    names = [consumer_name(), consumer_name()]
    workers = [
        spawn_worker(url, queue_name, tmp_path / f"w{k}.rec", names[k], claim_min_idle_ms=LEASE_MS, read_block_ms=1000)
        for k in range(2)
    ]
    try:
        with SyncQueue(queue_name, redis_url=url) as q:
            q.add("j", {"i": 0})
            # Redis 7.0 lists a consumer only once a read delivered it an entry: which worker gets the
            # job is a race, so both consumers are created as a delivery would have created them
            wait_until_sync(lambda: _snap(q).group_exists, 60, what="the workers' group")
            for name in names:
                q.driver.call(command("XGROUP", "CREATECONSUMER", q.keys.stream, "default", name))
            wait_until_sync(lambda: _both_beat(q, names), 60, what="both workers listed and beating")
            end = time.monotonic() + IDLE_LEASES * LEASE_MS / 1000
            samples = 0
            while time.monotonic() < end:
                s = _snap(q)
                assert {c.name for c in s.consumers} == set(names), (
                    f"a live idle worker's consumer was reaped: {s.consumers}"
                )
                assert s.live_consumers == 2 and all(c.live for c in s.consumers), s.consumers
                assert s.consumer_max_idle_ms == 0  # a beating worker is never "idle" to the alerts
                samples += 1
                time.sleep(LEASE_MS / 2000)
            assert samples >= IDLE_LEASES
            assert max(c.idle_ms for c in _snap(q).consumers) > 10 * LEASE_MS  # what fooled the janitor before
            workers[1].kill()
            killed = time.monotonic()
            wait_until_sync(lambda: _snap(q).live_consumers == 1, 30, what="the killed worker to count as gone")
            assert time.monotonic() - killed <= 2 * LEASE_MS / 1000 + 1.0  # two leases, a second of slack for the host
            gone = {w.consumer: w.live for w in _snap(q).workers}
            assert gone == {names[0]: True, names[1]: False}
            wait_until_sync(
                lambda: [c.name for c in _snap(q).consumers] == [names[0]], 30, what="the dead consumer to be reaped"
            )
            assert _snap(q).live_consumers == 1
    finally:
        for w in workers:
            w.kill()


def test_consumer_names_say_host_and_pid() -> None:
    import os
    import socket

    name = consumer_name()
    host = re.sub(r"[^A-Za-z0-9.-]+", "_", socket.gethostname())[:40]
    assert name.startswith(f"c-{host}-{os.getpid()}-") and len(name.rsplit("-", 1)[1]) == 8
    assert consumer_name(host="bad host\\x00\\n{}" * 10, pid=7).startswith("c-bad_host_x00_n_")
    assert len(consumer_name(host="h" * 500)) < 70
