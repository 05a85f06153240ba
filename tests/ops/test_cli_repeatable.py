"""``chasqui repeatable ...`` against real Redis: list pages, get, pause/resume/remove, import."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_provider_chasqui import RepeatPattern, SyncQueue
from tests.ops.test_cli import chasqui


def test_list_get_pause_resume_remove(redis_url: str, queue_name: str) -> None:
    q = SyncQueue(queue_name, redis_url=redis_url)
    q.upsert_repeatable_bulk([{"name": f"job{i}", "data": {"i": i}, "repeat": RepeatPattern.every(60_000 * (i + 1))}
                              for i in range(300)])
    q.upsert_repeatable_job("nightly", 1, repeat=RepeatPattern.cron("0 2 * * *", tz="America/New_York"))
    base = ["--redis-url", redis_url, "--json"]
    keys: list[str] = []
    cursor: list[str] = []
    pages = 0
    while True:  # cursor pages (a ZSCAN underneath): every spec once, no call loads them all
        page = json.loads(chasqui("repeatable", "list", queue_name, "--limit", "100", *cursor, *base).stdout)
        keys += [d["key"] for d in page["items"]]
        pages += 1
        if page["next_cursor"] is None:
            break
        cursor = ["--cursor", page["next_cursor"]]
    assert pages >= 2 and len(set(keys)) == 301 and "job0::every:60000" in keys

    got = json.loads(chasqui("repeatable", "get", queue_name, "nightly::cron:0 2 * * *:America/New_York", *base).stdout)
    assert (got["pattern"], got["tz"], got["paused"]) == ("0 2 * * *", "America/New_York", False)

    assert json.loads(chasqui("repeatable", "pause", queue_name, "job1::every:120000", *base).stdout)["paused"]
    assert q.get_repeatable_job("job1::every:120000").paused
    text = chasqui("repeatable", "get", queue_name, "job1::every:120000", "--redis-url", redis_url).stdout
    assert any(line.split() == ["paused", "True"] for line in text.splitlines()), text
    chasqui("repeatable", "resume", queue_name, "job1::every:120000", *base)
    assert not q.get_repeatable_job("job1::every:120000").paused
    chasqui("repeatable", "remove", queue_name, "job1::every:120000", *base)
    assert q.get_repeatable_job("job1::every:120000") is None

    missing = chasqui("repeatable", "remove", queue_name, "nope", "--redis-url", redis_url, check=False)
    assert missing.returncode == 4 and "no repeatable spec with key 'nope'" in missing.stderr
    missing = chasqui("repeatable", "get", queue_name, "nope", "--redis-url", redis_url, check=False)
    assert missing.returncode == 4
    q.close()


def test_import_csv_and_parquet(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    path = tmp_path / "specs.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["name", "cron", "tz", "every_ms", "data", "key"])
        w.writeheader()
        for i in range(2500):
            w.writerow({"name": "report", "cron": "*/5 * * * *", "tz": "Europe/Madrid", "every_ms": "",
                        "data": json.dumps({"tenant": i}), "key": f"tenant-{i}"})
    out = json.loads(chasqui("repeatable", "import", queue_name, str(path), "--redis-url", redis_url, "--json").stdout)
    assert out == {"imported": 2500}
    q = SyncQueue(queue_name, redis_url=redis_url)
    info = q.get_repeatable_job("tenant-2499")
    assert info.data == {"tenant": 2499} and info.pattern.tz == "Europe/Madrid"

    table = pa.table({"name": ["ping", "ping"], "every_ms": [1000, 2000], "data": ['{"a": 1}', '{"a": 2}']})
    pq.write_table(table, tmp_path / "specs.parquet")
    chasqui("repeatable", "import", queue_name, str(tmp_path / "specs.parquet"), "--redis-url", redis_url)
    assert q.get_repeatable_job("ping::every:2000").data == {"a": 2}

    bad = tmp_path / "bad.csv"
    bad.write_text("name,cron\nx,not a cron\n")
    proc = chasqui("repeatable", "import", queue_name, str(bad), "--redis-url", redis_url, check=False)
    assert proc.returncode == 2 and "invalid cron expression 'not a cron'" in proc.stderr
    q.close()
