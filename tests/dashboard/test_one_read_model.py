"""One read model (``core/inspect.py``): the CLI (``chasqui inspect`` and ``chasqui job show``,
run as real processes), the dashboard's reads (``Source``) and a worker's Prometheus depth
sampler are asked about the same queue and the same jobs, in every state a job can be in, and
must give the same answers.  Before, the dashboard and the metrics each had a reader of their
own, with other windows, clock skews and state names ("failed (in the DLQ)" vs "failed")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from engine_support import consumer_core

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.dashboard.data import Source
from airflow_provider_chasqui.sync.queue import SyncQueue
from airflow_provider_chasqui.worker.metrics import DepthSampler

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parents[2]
# what depends on the clock of the moment it is read (ages), and nothing else, is left out
CLOCKED = {"oldest_waiting_ms", "oldest_delayed_lag_ms", "consumers", "groups"}


def chasqui(*args: str) -> Any:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("CHASQUI_REDIS_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture
def seeded(redis_url: str, queue_name: str) -> dict[str, str]:
    """A job in every state: completed, failed (in the DLQ), delayed (one overdue), active
    (delivered to a consumer that holds it), waiting."""
    r = redis.Redis.from_url(redis_url)
    k = QueueKeys.for_queue(queue_name)
    core = consumer_core(queue_name, max_attempts=1, result_ttl_ms=60_000, failure_ttl_ms=60_000)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        done = q.add("square", {"x": 3})
        dead = q.add("explode", {"why": "test"})
        q.driver.call(core.create_group())
        # settled as a worker would: one completed with its result, one dead-lettered
        ready, refused = core.gate_fresh(q.driver.call(core.read(2, None))[0][1])
        assert len(ready) == 2 and not refused
        features, now = q.driver.features(), int(time.time() * 1000)
        q.driver.call(core.complete([(ready[0].entry_id, done.id, "square", 1, 5, b"\x09")], features, now))
        row, _outcome, _ = core.failure_row(ready[1], ValueError("boom"), False, 7, now)
        q.driver.call(core.fail([row], features, now))
        later = q.add("later", {}, delay=3_600_000)
        due = q.add("due", {}, delay=1)
        running = q.add("running", {"r": 1})
        r.xreadgroup("default", "c-held", {k.stream: ">"}, count=1)
        waiting = q.add("waiting", {"w": 1})
    time.sleep(0.05)  # the delayed "due" job is overdue now (nobody promotes on this queue)
    return {
        "completed": done.id,
        "failed": dead.id,
        "delayed": later.id,
        "overdue": due.id,
        "active": running.id,
        "waiting": waiting.id,
    }


def test_cli_dashboard_and_metrics_agree(redis_url: str, queue_name: str, seeded: dict[str, str]) -> None:
    src = Source("t", redis_url)
    sampler = DepthSampler(redis_url, queue_name)
    try:
        cli = chasqui("inspect", queue_name, "--redis-url", redis_url)
        board = src.queue_row(queue_name).snap.to_dict()
        depths = sampler.sample()
        for key in set(cli) | set(board):
            if key not in CLOCKED:
                assert cli[key] == board[key], key
        assert [c["name"] for c in cli["consumers"]] == [c["name"] for c in board["consumers"]] == ["c-held", "c-test"]
        assert (cli["stream"], cli["pending"], cli["delayed"], cli["dlq"], cli["waiting"]) == (2, 1, 2, 1, 1)
        assert cli["overdue"] == 1
        for key in ("stream", "pending", "delayed", "dlq", "overdue", "quarantined"):
            assert depths[key] == cli[key], key
        assert depths["consumers"] == len(cli["consumers"])
        assert depths["oldest_waiting_ms"] >= 0 and cli["oldest_waiting_ms"] is not None

        for state, job_id in seeded.items():
            shown = chasqui("job", "show", job_id, "-q", queue_name, "--redis-url", redis_url)
            seen = src.job(queue_name, job_id)
            assert seen is not None
            board_view = seen.to_dict()
            assert shown.pop("idle_ms") is None or state == "active"  # clocked: how long it was held so far
            board_view.pop("idle_ms")
            assert board_view == shown, state
            expected = "delayed" if state == "overdue" else state
            assert shown["state"] == expected, (state, shown)
    finally:
        sampler.close()
        src.close()


def test_a_spoiled_key_never_fails_a_view(redis_url: str, queue_name: str, seeded: dict[str, str]) -> None:
    """Keys of another type (hostile or foreign data) in the keyspace: before, each view failed
    whole on Redis' bare ``WRONGTYPE`` (``chasqui inspect``, the dashboard's queue row and the
    worker's depth gauges on one queue; ``chasqui queues`` on every queue of the server, for one
    spoiled key anywhere; ``job show`` for a spoiled events key).  Now the views count a spoiled
    key as empty and name it in ``spoiled`` (``job show`` in its notes), every other figure is
    the same as before, and a command that reads one key itself says which key is spoiled."""
    r = redis.Redis.from_url(redis_url)
    k = QueueKeys.for_queue(queue_name)
    other = QueueKeys.for_queue(queue_name + "-other")
    before = chasqui("inspect", queue_name, "--redis-url", redis_url)
    assert before["spoiled"] == {}
    r.delete(k.events)
    r.set(k.repeat_paused, b"\xff junk")
    r.rpush(k.events, b"junk")
    r.hset(k.prioritized, b"x", b"y")
    r.sadd(k.group_jobs("acme"), b"x")
    r.zadd(k.groups, {"acme": 1})
    r.set(other.stream, b"junk")
    src = Source("t", redis_url)
    sampler = DepthSampler(redis_url, queue_name)
    try:
        cli = chasqui("inspect", queue_name, "--redis-url", redis_url)
        spoiled = {k.repeat_paused: "string", k.events: "list", k.prioritized: "hash", k.group_jobs("acme"): "set"}
        assert cli["spoiled"] == spoiled
        assert cli["job_group_rows"] == [["acme", 0, 0]]
        for key in ("stream", "pending", "delayed", "dlq", "waiting", "overdue", "specs", "quarantined"):
            assert cli[key] == before[key], key
        board = src.queue_row(queue_name)
        assert board.snap.spoiled == spoiled and board.completed == [0] * len(board.completed)
        board_view = json.loads(json.dumps(board.snap.to_dict(), default=str))  # tuples as the CLI's lists
        for key in set(cli) - CLOCKED:
            assert board_view[key] == cli[key], key
        assert sampler.sample()["stream"] == cli["stream"]

        listing = chasqui("queues", "--match", queue_name + "*", "--redis-url", redis_url)
        rows = {q["queue"]: q for q in listing["queues"]}
        assert set(rows) == {queue_name, queue_name + "-other"}
        assert rows[queue_name + "-other"]["spoiled"] == {other.stream: "string"}
        assert rows[queue_name]["spoiled"] == {k.repeat_paused: "string", k.prioritized: "hash"}
        assert (rows[queue_name]["dlq"], rows[queue_name]["delayed"]) == (before["dlq"], before["delayed"])

        shown = chasqui("job", "show", seeded["waiting"], "-q", queue_name, "--redis-url", redis_url)
        assert shown["state"] == "waiting" and shown["events"] == []
        assert any(k.events in note and "holds a list" in note for note in shown["notes"]), shown["notes"]

        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        proc = subprocess.run(
            [sys.executable, "-m", "airflow_provider_chasqui.cli", "events", queue_name, "--redis-url", redis_url],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert proc.returncode == 1 and f"WRONGTYPE {k.events} holds another type than XREAD" in proc.stderr
    finally:
        sampler.close()
        src.close()
        r.delete(other.stream)
        r.close()
