"""Worker logs: ``--log-format json`` / ``CHASQUI_LOG_FORMAT=json`` from a real ``chasqui worker``
process (every line parsed back), the failed job's WARNING with its traceback, and the rate
limit that keeps a failure storm from flooding the log."""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import datetime

import pytest
from worker_support import subprocess_env

from airflow_provider_chasqui import SyncQueue, Worker
from airflow_provider_chasqui.cli_common.logs import JsonFormatter, set_log_context
from airflow_provider_chasqui.engine.worker import LogBudget

pytestmark = pytest.mark.timeout(300)


def _records(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))  # every line, stdout and stderr alike, is one JSON object
        except json.JSONDecodeError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    return records


@pytest.mark.parametrize("how", ["flag", "env"])
def test_json_log_lines_from_a_real_worker(start_worker, redis_url: str, queue_name: str, how: str) -> None:
    q = SyncQueue(queue_name, redis_url=redis_url)
    job = q.add("fail", {"n": 1}, attempts=2, backoff=1)
    args = ["-q", queue_name, "-H", "worker_handlers", "--no-scheduler", "--max-jobs", "2", "--log-level", "DEBUG"]
    env = subprocess_env(CHASQUI_REDIS_URL=redis_url)
    if how == "flag":
        args += ["--log-format", "json"]
    else:
        env["CHASQUI_LOG_FORMAT"] = "json"
    proc = start_worker(args, env=env)
    assert proc.wait_exit(120) == 0, proc.output()[-4000:]
    assert q.get_job_state(job.id) == "failed"
    records = _records(proc.output())
    for rec in records:
        assert {"ts", "level", "logger", "message", "pid"} <= set(rec), rec
        assert datetime.fromisoformat(rec["ts"].replace("Z", "+00:00")).tzinfo is not None
        assert rec["level"] in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    assert any(r["logger"] == "airflow_provider_chasqui.engine.worker" and r["queue"] == queue_name for r in records)
    # once per failed attempt, at WARNING, with the job's fields and the traceback inside the message
    failed = [r for r in records if r.get("job_id") == job.id and r["level"] == "WARNING"]
    assert [(r["job_name"], r["attempt"], r["queue"]) for r in failed] == [
        ("fail", 1, queue_name),
        ("fail", 2, queue_name),
    ], failed
    assert "retry in" in failed[0]["message"] and "dead-lettered (retries_exhausted)" in failed[1]["message"]
    for r in failed:
        assert "Traceback (most recent call last):" in r["message"]
        assert "RuntimeError: fail handler refuses {'n': 1}" in r["message"] and "in fail" in r["message"]
    started = [r for r in records if r.get("job_id") == job.id and r["level"] == "DEBUG"]
    assert [r["attempt"] for r in started] == [1, 2]  # --log-level DEBUG: the start of each attempt
    assert q.get_failure(job.id).traceback in failed[1]["message"] + "\n"


def test_json_formatter_fields_and_trace_hook() -> None:
    """trace_id / span_id come from the record (a tracing filter or ``extra=``); secrets are redacted."""
    fmt = JsonFormatter()
    set_log_context(queue="q-default")
    try:
        rec = logging.LogRecord("x.y", logging.INFO, __file__, 1, "to %s", ("redis://:s3cret@h:6379",), None)
        rec.trace_id, rec.span_id, rec.job_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331", "J1"
        out = json.loads(fmt.format(rec))
        assert out["queue"] == "q-default" and out["job_id"] == "J1" and out["logger"] == "x.y"
        assert (out["trace_id"], out["span_id"]) == ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
        assert "s3cret" not in json.dumps(out) and "attempt" not in out
        try:
            raise ValueError("line one\nline two")
        except ValueError:
            import sys

            rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "boom", (), sys.exc_info())
        line = fmt.format(rec)
        assert "\n" not in line and "ValueError: line one\nline two" in json.loads(line)["exception"]
    finally:
        set_log_context(queue=None)


def test_log_budget_counts_what_it_suppresses() -> None:
    now = [0.0]
    budget = LogBudget(2, 10.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(5)] == [(True, 0), (True, 0), (False, 0), (False, 0), (False, 0)]
    now[0] = 10.5  # a new window: the count of the last one is handed back once
    assert budget.take() == (True, 3) and budget.take() == (True, 0) and budget.take() == (False, 0)
    assert budget.take_suppressed() == 1 and budget.take_suppressed() == 0


def test_a_failure_storm_is_logged_within_the_budget(redis_url: str, queue_name: str, caplog) -> None:
    q = SyncQueue(queue_name, redis_url=redis_url)
    q.add_bulk([{"name": "x", "data": i, "attempts": 1} for i in range(30)])

    def boom(job):
        raise KeyError(job.data)

    async def run() -> None:
        w = Worker(
            queue_name,
            boom,
            redis_url=redis_url,
            max_jobs=30,
            run_scheduler=False,
            fail_log_burst=4,
            fail_log_window_secs=3600,
        )
        await asyncio.wait_for(w.run(), 120)

    with caplog.at_level(logging.WARNING, logger="airflow_provider_chasqui.engine.worker"):
        asyncio.run(run())
    per_job = [r for r in caplog.records if getattr(r, "job_id", None)]
    assert len(per_job) == 4 and all("KeyError" in r.getMessage() and "Traceback" in r.getMessage() for r in per_job)
    summary = [r.getMessage() for r in caplog.records if "not logged" in r.getMessage()]
    assert summary and summary[-1].endswith(
        "26 more failed jobs or refused entries not logged (at most 4 per 3600s)"
    ), summary
    assert len(q.peek_dlq(100)) == 30
