"""Job search (``core/search.py``, the dashboard's Search page; issue 28) and the one attempt
numbering of the job and DLQ pages.  Real Redis; jobs in every state, hostile names and values,
payloads larger than any window of bytes the search may read."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from engine_support import consumer_core

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.search import field_matches, search_jobs
from airflow_provider_chasqui.dashboard.data import Source
from airflow_provider_chasqui.errors import ConfigError
from airflow_provider_chasqui.sync.queue import SyncQueue

pytestmark = pytest.mark.timeout(120)
EVIL = "ord<er>'\"*?[x]\\ \u00e9"  # glob, HTML and quote characters in a job name


@pytest.fixture
def seeded(redis_url: str, queue_name: str) -> dict[str, Any]:
    r = redis.Redis.from_url(redis_url)
    k = QueueKeys.for_queue(queue_name)
    core = consumer_core(queue_name, max_attempts=1, result_ttl_ms=60_000, failure_ttl_ms=60_000)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        done = q.add(EVIL, {"customer": {"id": "c-1"}})
        dead = q.add(EVIL, {"customer": {"id": "c-42"}, "n": 7})
        q.driver.call(core.create_group())
        ready, _ = core.gate_fresh(q.driver.call(core.read(2, None))[0][1])
        features, now = q.driver.features(), int(time.time() * 1000)
        q.driver.call(core.complete([(ready[0].entry_id, done.id, EVIL, 1, 5, b"\x09")], features, now))
        row, _outcome, _ = core.failure_row(ready[1], ValueError("boom"), False, 7, now)
        q.driver.call(core.fail([row], features, now))
        later = q.add(EVIL, {"customer": {"id": "c-42"}, "flag": True}, delay=3_600_000)
        running = q.add(EVIL, {"customer": {"id": "c-42"}, "items": [{"sku": "A-1"}]})
        r.xreadgroup("default", "c-held", {k.stream: ">"}, count=1)
        waiting = q.add(EVIL, {"customer": {"id": "c-42"}, "n": 1})
        other = q.add("other", {"customer": {"id": "c-42"}})
        big = q.add(EVIL, {"customer": {"id": "c-9"}, "pad": "x" * 300_000})
    return {
        "completed": done.id,
        "failed": dead.id,
        "delayed": later.id,
        "active": running.id,
        "waiting": waiting.id,
        "other": other.id,
        "big": big.id,
    }


def _ids(src: Source, queue: str, **kw: Any) -> dict[str, str]:
    return {f.id: f.state for f in src.run(search_jobs(queue, **kw)).found}


def test_search_by_name_state_and_data_field(redis_url: str, queue_name: str, seeded: dict[str, Any]) -> None:
    src = Source("t", redis_url)
    try:
        every = _ids(src, queue_name, name=EVIL)
        assert every == {
            seeded["completed"]: "completed",
            seeded["failed"]: "failed",
            seeded["delayed"]: "delayed",
            seeded["active"]: "active",
            seeded["waiting"]: "waiting",
            seeded["big"]: "waiting",
        }
        for state in ("waiting", "active", "delayed", "failed", "completed"):
            assert set(_ids(src, queue_name, name=EVIL, state=state).values()) == {state}
        c42 = _ids(src, queue_name, data_field="customer.id", value="c-42")
        assert set(c42) == {seeded[s] for s in ("failed", "delayed", "active", "waiting", "other")}
        assert _ids(src, queue_name, name=EVIL, data_field="customer.id", value="c-42").keys() == c42.keys() - {
            seeded["other"]
        }
        assert set(_ids(src, queue_name, data_field="n", value="7")) == {seeded["failed"]}  # a number
        assert set(_ids(src, queue_name, data_field="items.0.sku", value="A-1")) == {seeded["active"]}
        assert set(_ids(src, queue_name, data_field="flag", value="true")) == {seeded["delayed"]}
        assert _ids(src, queue_name, data_field="n", value="true") == {}  # true is not 1
        assert _ids(src, queue_name, name="ord*") == {}  # a name is exact, never a pattern
        result = src.run(search_jobs(queue_name, data_field="customer.id", value="c-1"))
        assert result.found == [] and any("completed jobs keep no data" in n for n in result.notes)
        bounded = src.run(search_jobs(queue_name, name=EVIL, state="waiting", window=2))
        assert any("searched the oldest 2 entries only" in n for n in bounded.notes), bounded.notes
    finally:
        src.close()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"state": "running"}, "search state must be one of"),
        ({"data_field": "a"}, "needs both the field and the value"),
        ({"value": "a"}, "needs both the field and the value"),
        ({"name": 5}, "search name must be text"),
        ({"name": "x" * 2000}, "at most 1024 characters"),
        ({"name": "a\x00b"}, "without NUL"),
        ({"limit": 0}, "search limit must be a whole number"),
        ({"window": float("nan")}, "search window must be a whole number"),
        ({"window": True}, "search window must be a whole number"),
    ],
)
def test_bad_searches_are_refused_by_name(kw: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        next(search_jobs("q", **kw))


def test_field_matching_is_exact() -> None:
    data = {"a": {"b": [1, {"c": "x"}]}, "t": True, "f": 1.5, "s": "1"}
    assert field_matches(data, "a.b.1.c", "x") and not field_matches(data, "a.b.1.c", "y")
    assert field_matches(data, "a.b.0", "1") and not field_matches(data, "a.b.0", "true")
    assert field_matches(data, "t", "true") and not field_matches(data, "t", "1")
    assert field_matches(data, "f", "1.5") and not field_matches(data, "f", "NaN")
    assert field_matches(data, "s", "1") and not field_matches(data, "a.b.9", "1")
    assert not field_matches(data, "missing.path", "x") and not field_matches([1], "x", "1")


def test_the_job_and_dlq_pages_number_attempts_alike(redis_url: str, queue_name: str, seeded: dict[str, Any]) -> None:
    """The job page, the DLQ entry page and the events all call the one failed run attempt 1."""
    src = Source("t", redis_url)
    try:
        job = src.job(queue_name, seeded["failed"])
        assert job is not None and job.state == "failed" and job.attempt == 1
        entry = src.dlq_entry(queue_name, job.dlq["dlq_id"])
        assert entry is not None and entry["payload"]["attempt"] == 1
        active = src.job(queue_name, seeded["active"])
        assert active is not None and active.state == "active" and active.attempt == 1
        waiting = src.job(queue_name, seeded["waiting"])
        assert waiting is not None and waiting.attempt is None  # it never ran
    finally:
        src.close()
