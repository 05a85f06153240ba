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
