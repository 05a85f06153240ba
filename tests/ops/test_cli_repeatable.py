"""``chasqui repeatable ...`` against real Redis: list pages, get, pause/resume/remove, import."""

from __future__ import annotations

import asyncio
import csv
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import redis

from airflow_provider_chasqui import Queue, RepeatPattern, SyncQueue
from airflow_provider_chasqui.core.calls import command
from airflow_provider_chasqui.core.keys import QueueKeys
from tests.ops.test_cli import chasqui


def test_list_get_pause_resume_remove(redis_url: str, queue_name: str) -> None:
    q = SyncQueue(queue_name, redis_url=redis_url)
    q.upsert_repeatable_bulk(
        [{"name": f"job{i}", "data": {"i": i}, "repeat": RepeatPattern.every(60_000 * (i + 1))} for i in range(300)]
    )
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
            w.writerow(
                {
                    "name": "report",
                    "cron": "*/5 * * * *",
                    "tz": "Europe/Madrid",
                    "every_ms": "",
                    "data": json.dumps({"tenant": i}),
                    "key": f"tenant-{i}",
                }
            )
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


def plant_corrupt_specs(q: SyncQueue, r: redis.Redis) -> dict[str, str]:
    """Good specs next to every kind of bad entry; returns escaped key -> a word of its reason."""
    q.upsert_repeatable_job("good", 1, repeat=RepeatPattern.every(60_000), key="good")
    q.upsert_repeatable_job("paused", 1, repeat=RepeatPattern.every(60_000), key="paused")
    q.pause_repeatable("paused")
    base = q.keys.repeat_spec("").encode()
    bad: dict[str, str] = {}
    for key, score in (("inf", float("inf")), ("neginf", float("-inf")), ("badfired", 1e12), ("badskip", 1e12)):
        q.upsert_repeatable_job(key, 1, repeat=RepeatPattern.every(60_000), key=key)
        r.zadd(q.keys.repeat, {key: score})
    bad.update({"inf": "inf", "neginf": "-inf"})
    r.hset(q.keys.repeat_spec("badfired"), "fired", "abc")
    r.hset(q.keys.repeat_spec("badskip"), "skipped", "1.5")
    bad.update({"badfired": "fired", "badskip": "skipped"})
    r.zadd(q.keys.repeat, {b"\xff\xfe": 1e12, "typed": 1e12, "junk": 1e12})
    r.hset(base + b"\xff\xfe", "spec", q.driver.call(command("HGET", q.keys.repeat_spec("good"), "spec")))
    r.set(base + b"typed", "x")
    r.hset(base + b"junk", "spec", b"\xc1")
    bad.update({"\\xff\\xfe": "utf-8", "typed": "string", "junk": "msgpack"})
    r.zadd(q.keys.repeat_paused, {"paused": float("inf")})
    bad["paused"] = "inf"
    return bad


def test_list_inspect_and_get_show_corrupt_specs_instead_of_failing(redis_url: str, queue_name: str) -> None:
    q = SyncQueue(queue_name, redis_url=redis_url)
    with redis.Redis.from_url(redis_url) as r:
        bad = plant_corrupt_specs(q, r)
    items, cursor = q.list_repeatable(count=100)
    assert cursor is None
    corrupt = {i.key: i for i in items if i.corrupt}
    assert set(corrupt) == set(bad) and [i.key for i in items if not i.corrupt] == ["good"]
    for key, word in bad.items():
        assert word in corrupt[key].reason.lower(), (key, corrupt[key].reason)
    assert corrupt["\\xff\\xfe"].raw_key == b"\xff\xfe" and corrupt["paused"].paused
    assert corrupt["inf"].score == "inf"
    # chasquimq's listing has no room for them: it leaves out what it cannot read (counters it does not show)
    assert sorted(m.key for m in q.get_repeatable_jobs()) == ["badfired", "badskip", "good"]

    async def listed() -> set[str]:
        async with Queue(queue_name, redis_url=redis_url) as aq:
            got, _c = await aq.list_repeatable()
            return {i.key for i in got if i.corrupt}

    assert asyncio.run(listed()) == set(bad)

    base = ["--redis-url", redis_url]
    page = json.loads(chasqui("repeatable", "list", queue_name, *base, "--json").stdout)
    rows = {d["key"]: d for d in page["items"]}
    assert {k for k, d in rows.items() if d["corrupt"]} == set(bad) and rows["good"]["corrupt"] is False
    assert rows["typed"]["reason"] == "the spec key is a string, not a hash" and rows["inf"]["score"] == "inf"
    text = chasqui("repeatable", "list", queue_name, *base).stdout
    assert "CORRUPT" in text and "\\xff\\xfe: the spec key is not UTF-8" in text

    snap = json.loads(chasqui("inspect", queue_name, *base, "--json").stdout)
    assert ["neginf", "-inf"] in snap["next_fires"] and snap["specs"] == 8
    text = chasqui("inspect", queue_name, *base).stdout
    assert "neginf" in text and "-inf" in text
    proc = chasqui("repeatable", "get", queue_name, "typed", *base, check=False)
    assert proc.returncode == 1 and "spec 'typed' is corrupt: the spec key is a string" in proc.stderr
    proc = chasqui("repeatable", "get", queue_name, "badfired", *base, check=False)
    assert proc.returncode == 1 and "fired counter is not an integer" in proc.stderr
    assert "Traceback" not in proc.stderr
    r2 = redis.Redis.from_url(redis_url)
    r2.zadd(q.keys.repeat, {"a": float("inf")})
    r2.zrem(q.keys.repeat, "neginf", "badfired", "badskip", "\xff\xfe", b"\xff\xfe", "typed", "junk", "good")
    r2.close()
    snap = json.loads(chasqui("inspect", queue_name, *base, "--json").stdout)
    assert snap["next_fires"] == [["a", "inf"], ["inf", "inf"]]
    assert "inf (no date)" in chasqui("inspect", queue_name, *base).stdout

    q.close()


def write_csv(path: Path, rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["name", "cron", "tz", "every_ms", "data", "key"])
        w.writeheader()
        for row in rows:
            w.writerow({"cron": "", "tz": "", "every_ms": "", "data": "", "key": "", **row})


def test_import_validates_every_row_before_writing(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    rows = [
        {"name": "a", "every_ms": "1000"},
        {"name": "b", "cron": "* * * * *", "tz": "Mars/Olympus"},
        {"name": "c", "every_ms": "1000", "data": "{not json"},
        {"name": "d", "cron": "*/5 * * * *"},
        {"name": "", "every_ms": "5"},
        {"name": "e", "every_ms": "ten"},
    ]
    path = tmp_path / "mixed.csv"
    write_csv(path, rows)
    base = ["--redis-url", redis_url]
    k = QueueKeys.for_queue(queue_name)
    r = redis.Redis.from_url(redis_url)
    try:
        proc = chasqui("repeatable", "import", queue_name, str(path), *base, check=False)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert "4 invalid row(s)" in proc.stderr and "nothing was imported" in proc.stderr
        for line, word in ((3, "Mars/Olympus"), (4, "not JSON"), (6, "'name' column"), (7, "ten")):
            assert any(ln.strip().startswith(f"row {line}:") and word in ln for ln in proc.stderr.splitlines()), (
                line,
                proc.stderr,
            )
        assert r.zcard(k.repeat) == 0  # nothing written, not even the valid rows before the first bad one

        dry = json.loads(
            chasqui(
                "repeatable", "import", queue_name, str(path), *base, "--json", "--dry-run", "--skip-invalid"
            ).stdout
        )
        assert dry == {"valid": 2, "invalid": 4, "imported": 0} and r.zcard(k.repeat) == 0

        out = chasqui("repeatable", "import", queue_name, str(path), *base, "--json", "--skip-invalid")
        assert json.loads(out.stdout) == {"imported": 2, "invalid": 4} and "skipped row 3:" in out.stderr
        assert sorted(r.zrange(k.repeat, 0, -1)) == [b"a::every:1000", b"d::cron:*/5 * * * *:UTC"]

        good = tmp_path / "good.csv"
        write_csv(good, [{"name": "x", "every_ms": "2000"}])
        dry = json.loads(chasqui("repeatable", "import", queue_name, str(good), *base, "--json", "--dry-run").stdout)
        assert dry == {"valid": 1, "invalid": 0, "imported": 0} and r.zcard(k.repeat) == 2
        binary = tmp_path / "binary.csv"
        binary.write_bytes(b"name,every_ms\n\xff\xfe,1000\n")
        proc = chasqui("repeatable", "import", queue_name, str(binary), *base, check=False)
        assert proc.returncode == 2 and "cannot read" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        r.close()


def test_import_of_hostile_rows_reports_each_row(redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """Issue 26: deeply nested JSON data ended the import in a RecursionError traceback; a zone
    that means the host's own is refused like any bad zone.  Each is a row error, nothing written."""
    rows = [
        {"name": "deep", "every_ms": "1000", "data": "[" * 60_000 + "]" * 60_000},
        {"name": "host", "cron": "0 0 * * *", "tz": "localtime"},
        {"name": "ok", "every_ms": "1000", "data": '{"a": [1, 2]}'},
    ]
    path = tmp_path / "hostile.csv"
    write_csv(path, rows)
    k = QueueKeys.for_queue(queue_name)
    proc = chasqui("repeatable", "import", queue_name, str(path), "--redis-url", redis_url, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "2 invalid row(s)" in proc.stderr, proc.stderr
    for line, word in ((2, "nested too deeply"), (3, "localtime")):
        assert any(ln.strip().startswith(f"row {line}:") and word in ln for ln in proc.stderr.splitlines()), (
            line,
            proc.stderr,
        )
    with redis.Redis.from_url(redis_url) as r:
        assert r.zcard(k.repeat) == 0


def test_import_names_an_every_ms_that_is_not_whole_milliseconds(
    redis_url: str, queue_name: str, tmp_path: Path
) -> None:
    """A CSV cell said Python's "invalid literal for int() with base 10"; a Parquet float of
    1.5 was cut to 1 ms without a word (and NaN said "cannot convert float NaN to integer").
    A whole float (a pandas column with nulls is float) is still taken."""
    csv_path = tmp_path / "every.csv"
    write_csv(csv_path, [{"name": "n", "every_ms": v} for v in ("abc", "1e3", "-5", "2000")])
    proc = chasqui(
        "repeatable", "import", queue_name, str(csv_path), "--redis-url", redis_url, "--dry-run", check=False
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    for line, value in ((2, "'abc'"), (3, "'1e3'"), (4, "'-5'")):
        assert f"row {line}: 'every_ms' must be a whole number of milliseconds, got {value}" in proc.stderr
    pq_path = tmp_path / "every.parquet"
    pq.write_table(pa.table({"name": ["n", "n", "n"], "every_ms": [float("nan"), 1.5, 3000.0]}), pq_path)
    proc = chasqui("repeatable", "import", queue_name, str(pq_path), "--redis-url", redis_url, check=False)
    assert proc.returncode == 2 and "2 invalid row(s)" in proc.stderr, proc.stderr
    assert "row 2: every interval_ms must be an int from 1 to 2**64 - 1, got nan" in proc.stderr
    assert "row 3: every interval_ms must be an int from 1 to 2**64 - 1, got 1.5" in proc.stderr
    proc = chasqui("repeatable", "import", queue_name, str(pq_path), "--redis-url", redis_url, "--skip-invalid")
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        [spec], _ = q.list_repeatable()
        assert spec.pattern.interval_ms == 3000
