"""The real ``chasqui`` command (subprocess) against real Redis: outputs and exit codes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import msgpack
import pytest
import redis

from airflow_provider_chasqui import Job, SyncQueue, Worker
from airflow_provider_chasqui.core.keys import QueueKeys


def chasqui(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        input=stdin,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr}")
    return proc


@pytest.fixture
def seeded(redis_url: str, queue_name: str) -> SyncQueue:
    """Three waiting jobs, one delayed job and two DLQ entries with known reasons."""
    q = SyncQueue(queue_name, redis_url=redis_url)
    for i in range(3):
        q.add("send", {"i": i})
    q.add("later", 1, delay=60_000)
    k = QueueKeys.for_queue(queue_name)
    r = redis.Redis.from_url(redis_url)
    env = msgpack.packb(["JOB1", msgpack.packb({"a": 1}), 1700000000000, 2])
    r.xadd(k.dlq, {"d": env, "n": "boom", "source_id": "1-0", "reason": "retries_exhausted"})
    r.xadd(k.dlq, {"d": b"", "source_id": "2-0", "reason": "malformed", "detail": "fields not an array"})
    yield q
    q.close()


def test_inspect_json_reports_the_real_counts(seeded: SyncQueue, redis_url: str) -> None:
    out = json.loads(chasqui("inspect", seeded.name, "--json", "--redis-url", redis_url).stdout)
    assert (out["stream"], out["delayed"], out["dlq"], out["specs"]) == (3, 1, 2, 0)
    assert out["group_exists"] is False and out["pending"] == 0
    assert out["oldest_delayed_lag_ms"] == 0


def test_inspect_table_for_people(seeded: SyncQueue, redis_url: str) -> None:
    text = chasqui("inspect", seeded.name, "--redis-url", redis_url).stdout
    assert f"queue {seeded.name}" in text
    assert "0 (group not created)" in text
    assert any(line.startswith("stream") and line.split()[1] == "3" for line in text.splitlines())


def test_dlq_peek_and_replay(seeded: SyncQueue, redis_url: str) -> None:
    rows = json.loads(chasqui("dlq", "peek", seeded.name, "--json", "--redis-url", redis_url).stdout)
    assert [(r["name"], r["reason"]) for r in rows] == [("boom", "retries_exhausted"), ("", "malformed")]
    human = chasqui("dlq", "peek", seeded.name, "--redis-url", redis_url).stdout
    assert "malformed: 1, retries_exhausted: 1" in human
    refused = chasqui("dlq", "replay", seeded.name, "--redis-url", redis_url, check=False, stdin="")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    done = json.loads(chasqui("dlq", "replay", seeded.name, "--yes", "--json", "--redis-url", redis_url).stdout)
    assert done == {"replayed": 1, "limit": 100, "skipped": 1}  # the malformed entry cannot be replayed and stays
    left = seeded.peek_dlq()
    assert [r["reason"] for r in left] == ["malformed"]
    r = redis.Redis.from_url(redis_url)
    replayed = r.xrange(seeded.keys.stream)[-1][1]
    assert replayed[b"n"] == b"boom" and msgpack.unpackb(replayed[b"d"])[3] == 0


def test_events_prints_chasqui_format(redis_url: str, queue_name: str) -> None:
    k = QueueKeys.for_queue(queue_name)
    r = redis.Redis.from_url(redis_url)
    r.xadd(
        k.events,
        {"e": "completed", "id": "J1", "ts": "1700000000106", "n": "send-email", "attempt": "1", "duration_us": "842"},
    )
    r.xadd(k.events, {"e": "drained", "id": "", "ts": "1700000000200"})
    lines = chasqui("events", queue_name, "--redis-url", redis_url).stdout.splitlines()
    assert lines[0].startswith("2023-11-14T22:13:20.106+00:00 ")
    assert lines[0].endswith("completed id=J1 name=send-email attempt=1 duration_us=842")
    assert lines[1].endswith("drained id=- name=-")
    js = chasqui("events", queue_name, "--json", "--max-events", "1", "--redis-url", redis_url).stdout
    assert json.loads(js)["e"] == "completed"


def test_events_follow_sees_new_events(redis_url: str, queue_name: str) -> None:
    k = QueueKeys.for_queue(queue_name)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "airflow_provider_chasqui.cli",
            "events",
            queue_name,
            "--follow",
            "--from",
            "0-0",
            "--max-events",
            "2",
            "--block-ms",
            "200",
            "--redis-url",
            redis_url,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    r = redis.Redis.from_url(redis_url)
    r.xadd(k.events, {"e": "waiting", "id": "A", "ts": "1"})
    r.xadd(k.events, {"e": "waiting", "id": "B", "ts": "2"})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert [line.split()[3] for line in out.splitlines()] == ["id=A", "id=B"]


def test_events_follow_reads_on_once_a_full_events_stream_is_made_again(redis_url: str, queue_name: str) -> None:
    """It reads an entry at the largest id (nothing can follow it); the stream is deleted and
    written again, every new id below that one: it reads the new stream (before, it waited
    forever)."""
    k = QueueKeys.for_queue(queue_name)
    r = redis.Redis.from_url(redis_url)
    r.xadd(k.events, {"e": "junk", "id": "X", "ts": "1"}, id="18446744073709551615-18446744073709551615")
    args = ["events", queue_name, "--follow", "--from", "0-0", "--max-events", "3", "--block-ms", "200"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args, "--redis-url", redis_url],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().split()[2:4] == ["junk", "id=X"]
    r.delete(k.events)
    r.xadd(k.events, {"e": "waiting", "id": "A", "ts": "1"})
    r.xadd(k.events, {"e": "waiting", "id": "B", "ts": "2"})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert [line.split()[3] for line in out.splitlines()] == ["id=A", "id=B"]


def test_watch_refreshes_with_deltas(seeded: SyncQueue, redis_url: str) -> None:
    out = chasqui("watch", seeded.name, "--iterations", "2", "--interval-ms", "10", "--redis-url", redis_url).stdout
    assert out.count("\x1b[H\x1b[2J") == 2
    assert "3 (+0)" in out


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["watch", "q", "--interval-ms", "0"], "--interval-ms"),  # was a refresh loop without a pause
        (["watch", "q", "--iterations", "-1"], "--iterations"),
        (["events", "q", "--follow", "--block-ms", "0"], "--block-ms"),
        (["events", "q", "--max-events", "-1"], "--max-events"),
        (["dlq", "peek", "q", "--limit", "0"], "--limit"),
        (["dlq", "replay", "q", "--limit", "-5", "--yes"], "--limit"),
        (["job", "show", "j", "--queue", "q", "--events", "0"], "--events"),
        (["job", "show", "j", "--queue", "q", "--max-data-bytes", "-1"], "--max-data-bytes"),
        (["repeatable", "list", "q", "--limit", "0"], "--limit"),
        (["dashboard", "--port", "70000"], "--port"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_numeric_flags_out_of_range_are_usage_errors(redis_url: str, args: list[str], flag: str) -> None:
    proc = chasqui(*args, "--redis-url", redis_url, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert f"argument {flag}" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_errors_name_the_problem_and_exit_codes(redis_url: str) -> None:
    bad = chasqui("inspect", "bad{name", "--redis-url", redis_url, check=False)
    assert bad.returncode == 2 and "hash tag" in bad.stderr
    down = chasqui("inspect", "q", "--redis-url", "redis://127.0.0.1:1", check=False)
    assert down.returncode == 3 and "--redis-url" in down.stderr
    usage = chasqui("dlq", check=False)
    assert usage.returncode == 2


@pytest.mark.parametrize("position", ["99999999999999999999999-0", "1-18446744073709551616", "abc", "1-"])
def test_an_events_position_past_a_stream_id_is_a_usage_error(redis_url: str, queue_name: str, position: str) -> None:
    """Each part of a stream id is a u64: a position past one was Redis' "Invalid stream ID"
    (exit 3, as if the server failed), and is the user's error now."""
    proc = chasqui("events", queue_name, "--from", position, "--redis-url", redis_url, check=False)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert f"an events position must be a stream id (<ms>-<seq>) or '$', got {position!r}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_job_show_prints_data_with_tuple_keys(redis_url: str, queue_name: str) -> None:
    """A tuple-keyed dict decodes with tuple keys, which ``json.dumps`` refuses: ``job show``
    ended in a traceback (and ``--json`` after writing half a line). Such a key shows as its repr."""
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("n", {(1, 2): "v", "k": [1]})
    human = chasqui("job", "show", job.id, "--queue", queue_name, "--redis-url", redis_url)
    assert '"(1, 2)": "v"' in human.stdout and "Traceback" not in human.stderr
    out = chasqui("job", "show", job.id, "--queue", queue_name, "--redis-url", redis_url, "--json")
    assert json.loads(out.stdout)["data"] == {"(1, 2)": "v", "k": [1]}


def test_job_logs_and_show_print_the_lines_a_handler_logged(redis_url: str, queue_name: str) -> None:
    async def handler(job: Job) -> None:
        for i in range(3):
            await job.log(f"step {i} \x1b[31m")  # a control character prints escaped

    async def one_job() -> None:
        worker = Worker(queue_name, handler, redis_url=redis_url, run_scheduler=False, read_block_ms=200, max_jobs=1)
        await asyncio.wait_for(worker.run(), 30)

    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("n", {})
    asyncio.run(one_job())
    target = ["--queue", queue_name, "--redis-url", redis_url]
    out = chasqui("job", "logs", job.id, *target).stdout.splitlines()
    assert [line.split(" ")[:2] for line in out] == [["step", "0"], ["step", "1"], ["step", "2"]]
    assert "\x1b" not in "".join(out)
    newest = chasqui("job", "logs", job.id, *target, "--newest-first", "--end", "0").stdout
    assert newest.startswith("step 2") and newest.count("\n") == 1
    as_json = json.loads(chasqui("job", "logs", job.id, *target, "--json", "--start", "1").stdout)
    assert as_json["count"] == 3 and [line[:6] for line in as_json["lines"]] == ["step 1", "step 2"]
    assert "log (3 lines):" in chasqui("job", "show", job.id, *target).stdout
    assert "no log lines" in chasqui("job", "logs", "never-logged", *target).stdout
    bad = chasqui("job", "logs", job.id, *target, "--start", "x", check=False)
    assert bad.returncode == 2 and "--start" in bad.stderr
