"""The operator CLI of issue 16, run as real processes against real Redis: ``chasqui queues``,
``chasqui job show``, ``chasqui scheduler`` / ``promoter``, shell completion, and the rules every
command follows (help text on every option, ``$CHASQUI_REDIS_URL``, ``--json``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from engine_support import wait_until_sync

from airflow_provider_chasqui import ConfigError, JobNotFound, Queue, RepeatPattern, SyncQueue
from airflow_provider_chasqui.cli import build_parser
from airflow_provider_chasqui.core.inspect import list_queues as list_queues_flow
from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.engine.queue import list_queues as async_list_queues
from airflow_provider_chasqui.sync._driver import SyncDriver
from airflow_provider_chasqui.sync.queue import list_queues
from airflow_provider_chasqui.worker.cli import build_parser as worker_parser

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("CHASQUI_REDIS_URL", None)
    env.update(extra)
    return env


def chasqui(
    *args: str, env: dict[str, str] | None = None, check: bool = True, stdin: str | None = "", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        env=env or _env(),
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {proc.stderr}")
    return proc


def launch(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "airflow_provider_chasqui.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env or _env(),
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


# ---- chasqui queues ----------------------------------------------------------------------------
@pytest.fixture
def two_queues(own_url: str, queue_name: str) -> Iterator[tuple[str, str, str]]:
    """On a server of this module alone: ``<q>-a`` (3 waiting, 1 delayed, 1 DLQ entry, a spec, a
    paused spec) and ``<q>-b`` (2 pending of 5, one consumer)."""
    a, b = f"{queue_name}-a", f"{queue_name}-b"
    with SyncQueue(a, redis_url=own_url) as qa, SyncQueue(b, redis_url=own_url) as qb:
        for i in range(3):
            qa.add("send", {"i": i})
        qa.add("later", 1, delay=60_000)
        qa.upsert_repeatable_job("beat", 1, repeat=RepeatPattern.every(60_000))
        qa.upsert_repeatable_job("paused", 1, repeat=RepeatPattern.every(60_000), key="p")
        qa.pause_repeatable("p")
        for i in range(5):
            qb.add("send", i)
    with redis.Redis.from_url(own_url) as raw:
        raw.xadd(QueueKeys.for_queue(a).dlq, {"d": b"", "reason": "malformed", "detail": "x"})
        kb = QueueKeys.for_queue(b)
        raw.xgroup_create(kb.stream, "default", id="0")
        raw.xreadgroup("default", "c-1", {kb.stream: ">"}, count=2)
    yield own_url, a, b
    with redis.Redis.from_url(own_url) as raw:
        for q in (a, b):
            for key in raw.scan_iter(match="{chasqui:" + q + "}*"):
                raw.delete(key)


def test_queues_lists_every_queue_with_its_counts_from_a_scan(two_queues: tuple[str, str, str]) -> None:
    url, a, b = two_queues
    with redis.Redis.from_url(url) as raw:
        raw.config_resetstat()
    out = json.loads(chasqui("queues", "--match", a[:-2] + "*", "--json", "--redis-url", url).stdout)
    rows = {q["queue"]: q for q in out["queues"]}
    assert set(rows) == {a, b} and out["truncated"] is False and out["cursor"] == "0"
    assert {k: rows[a][k] for k in ("waiting", "pending", "delayed", "dlq", "specs", "paused_specs", "consumers")} == {
        "waiting": 3,
        "pending": 0,
        "delayed": 1,
        "dlq": 1,
        "specs": 1,
        "paused_specs": 1,
        "consumers": 0,
    }
    assert {k: rows[b][k] for k in ("waiting", "pending", "delayed", "dlq", "consumers", "groups")} == {
        "waiting": 3,
        "pending": 2,
        "delayed": 0,
        "dlq": 0,
        "consumers": 1,
        "groups": 1,
    }
    with redis.Redis.from_url(url) as raw:
        stats = raw.info("commandstats")
    assert "cmdstat_scan" in stats and "cmdstat_keys" not in stats  # a cursor scan, never KEYS
    text = chasqui("queues", "--match", a[:-2] + "*", "--redis-url", url).stdout
    assert text.splitlines()[0].split() == [
        "queue",
        "waiting",
        "pending",
        "delayed",
        "dlq",
        "specs",
        "consumers",
        "live",
        "workers",
        "state",
    ]
    assert any(line.split()[:4] == [b, "3", "2", "0"] for line in text.splitlines())
    assert "1 (+1 paused)" in text


def test_queue_pause_and_resume_show_everywhere(two_queues: tuple[str, str, str]) -> None:
    """``chasqui queue pause|resume`` (issue 24): the queues table, ``inspect`` and ``--json`` agree."""
    url, a, b = two_queues
    paused = json.loads(chasqui("queue", "pause", a, "--json", "--redis-url", url).stdout)
    assert paused == {"queue": a, "paused": True}
    rows = {
        q["queue"]: q
        for q in json.loads(chasqui("queues", "--match", a[:-2] + "*", "--json", "--redis-url", url).stdout)["queues"]
    }
    assert (rows[a]["paused"], rows[b]["paused"]) == (True, False)
    table = chasqui("queues", "--match", a[:-2] + "*", "--redis-url", url).stdout
    assert [line.split()[-1] for line in table.splitlines() if line.startswith(a)] == ["paused"]
    assert "paused (no worker starts its jobs)" in chasqui("inspect", a, "--redis-url", url).stdout
    with SyncQueue(a, redis_url=url) as q:
        assert q.is_paused()
    assert "is running" in chasqui("queue", "resume", a, "--redis-url", url).stdout
    with SyncQueue(a, redis_url=url) as q:
        assert not q.is_paused()
    assert "running" in chasqui("inspect", a, "--redis-url", url).stdout
    bad = chasqui("queue", "pause", "bad{name}", "--redis-url", url, check=False)
    assert bad.returncode != 0 and "hash tag" in bad.stderr


def test_queue_limits_sets_shows_and_clears_the_rate_limit(two_queues: tuple[str, str, str]) -> None:
    url, a, b = two_queues
    shown = json.loads(chasqui("queue", "limits", a, "--rate", "25/2000", "--json", "--redis-url", url).stdout)
    assert shown == {"queue": a, "paused": False, "rate_limit": {"max_jobs": 25, "per_ms": 2000}, "concurrency": None}
    with SyncQueue(a, redis_url=url) as q:
        assert (q.get_rate_limit().max_jobs, q.get_rate_limit().per_ms) == (25, 2000)
    table = chasqui("queues", "--match", a[:-2] + "*", "--redis-url", url).stdout
    assert [line.split()[-1] for line in table.splitlines() if line.startswith(a)] == ["25/2000ms"]
    assert "25 jobs per 2000 ms" in chasqui("inspect", a, "--redis-url", url).stdout
    for bad, says in (("0/1000", "max_jobs"), ("10/0", "per_ms"), ("ten/1000", "JOBS/MILLISECONDS"), ("10", "JOBS/")):
        proc = chasqui("queue", "limits", a, "--rate", bad, "--redis-url", url, check=False)
        assert proc.returncode == 2 and says in proc.stderr, (bad, proc.stderr)
    assert "rate limit: none" in chasqui("queue", "limits", a, "--clear", "--redis-url", url).stdout
    with SyncQueue(a, redis_url=url) as q:
        assert q.get_rate_limit() is None


def test_queue_limits_sets_shows_and_clears_the_concurrency(two_queues: tuple[str, str, str]) -> None:
    url, a, b = two_queues
    shown = json.loads(chasqui("queue", "limits", a, "--concurrency", "4", "--json", "--redis-url", url).stdout)
    assert shown == {"queue": a, "paused": False, "rate_limit": None, "concurrency": 4}
    chasqui("queue", "limits", a, "--rate", "5/1000", "--redis-url", url)  # one limit kept while the other is set
    with SyncQueue(a, redis_url=url) as q:
        assert q.get_concurrency() == 4 and q.get_rate_limit() is not None
    table = chasqui("queues", "--match", a[:-2] + "*", "--redis-url", url).stdout
    assert [line.split("  ")[-1].strip() for line in table.splitlines() if line.startswith(a)] == [
        "5/1000ms, max 4 running"
    ]
    assert "0 of 4 slots held" in chasqui("inspect", a, "--redis-url", url).stdout
    for bad in ("0", "-3", "four", "1.5"):
        proc = chasqui("queue", "limits", a, "--concurrency", bad, "--redis-url", url, check=False)
        assert proc.returncode == 2 and "positive integer" in proc.stderr, (bad, proc.stderr)
    proc = chasqui("queue", "limits", a, "--concurrency", str(10**7), "--redis-url", url, check=False)
    assert proc.returncode == 2 and "concurrency" in proc.stderr
    out = chasqui("queue", "limits", a, "--clear", "--redis-url", url).stdout
    assert "rate limit: none; concurrency: none" in out
    with SyncQueue(a, redis_url=url) as q:
        assert q.get_concurrency() is None and q.get_rate_limit() is None


def test_prioritized_and_grouped_jobs_show_in_queues_and_inspect(two_queues: tuple[str, str, str]) -> None:
    """Jobs added with a priority or a group wait beside the stream: the listing and
    ``inspect`` count them (the groups in turn order)."""
    url, a, b = two_queues
    with SyncQueue(a, redis_url=url) as q:
        q.add_bulk([{"name": "p", "data": i, "priority": 1 + i % 2} for i in range(3)])
    rows = {
        q["queue"]: q
        for q in json.loads(chasqui("queues", "--match", a[:-2] + "*", "--json", "--redis-url", url).stdout)["queues"]
    }
    assert (rows[a]["prioritized"], rows[b]["prioritized"]) == (3, 0)
    table = chasqui("queues", "--match", a[:-2] + "*", "--redis-url", url).stdout
    assert "(+3 prioritized)" in next(line for line in table.splitlines() if line.startswith(a))
    assert "3 (added with a priority" in chasqui("inspect", a, "--redis-url", url).stdout
    with SyncQueue(a, redis_url=url) as q:
        q.add_bulk([{"name": "t", "data": i, "group": ["acme", "initech"][i % 2]} for i in range(5)])
    shown = chasqui("inspect", a, "--redis-url", url).stdout
    assert "2 with waiting jobs; acme: 3 waiting, 0 running; initech: 2 waiting, 0 running" in shown


def test_queues_says_when_a_cap_cut_the_listing(two_queues: tuple[str, str, str]) -> None:
    url, a, b = two_queues
    limited = json.loads(
        chasqui("queues", "--match", a[:-2] + "*", "--limit", "1", "--json", "--redis-url", url).stdout
    )
    assert [q["queue"] for q in limited["queues"]] == [a] and limited["truncated"] is True
    assert (
        "more queues may exist" in chasqui("queues", "--match", a[:-2] + "*", "--limit", "1", "--redis-url", url).stdout
    )


def test_list_queues_caps_the_scan_work(two_queues: tuple[str, str, str]) -> None:
    url, a, b = two_queues
    driver = SyncDriver(url)
    try:
        cut = driver.run(list_queues_flow(match=a[:-2] + "*", scan_count=1, max_scan_calls=1))
        assert cut.truncated and cut.cursor != "0" and cut.scan_calls == 1
        whole = list_queues(driver, match=a[:-2] + "*")
        assert [q.queue for q in whole.queues] == [a, b] and not whole.truncated
    finally:
        driver.close()
    listing = asyncio.run(async_list_queues(url, match=a[:-2] + "*"))  # the asyncio twin, for dashboards
    assert listing == whole


@pytest.mark.parametrize(
    "cursor", ["abc", "-1", "nan", "1.5", " 5", "\u0663", str(2**64), None, -1, 2**64, True], ids=ascii
)
def test_a_listing_cursor_that_is_no_scan_cursor_is_a_usage_error(two_queues: tuple[str, str, str], cursor) -> None:
    """Redis answered "invalid cursor" (exit 1, a ScriptError), or took ``-1`` as 2**64 - 1 and
    listed from a place no listing printed; the cursor a listing prints still continues it."""
    url, a, _b = two_queues
    driver = SyncDriver(url)
    try:
        with pytest.raises(ConfigError, match="cursor must be the cursor a listing returned") as caught:
            list_queues(driver, match=a[:-2] + "*", cursor=cursor)
        assert isinstance(caught.value, TypeError) == (not isinstance(cursor, str | int) or cursor is True)
        cut = driver.run(list_queues_flow(match=a[:-2] + "*", scan_count=1, max_scan_calls=1))
        rest = list_queues(driver, match=a[:-2] + "*", cursor=int(cut.cursor))  # an int cursor is taken too
        assert not rest.truncated
    finally:
        driver.close()
    if isinstance(cursor, str):
        proc = chasqui("queues", "--cursor", cursor, "--redis-url", url, check=False)
        assert proc.returncode == 2 and "cursor must be the cursor a listing returned" in proc.stderr, proc.stderr


# ---- chasqui job show --------------------------------------------------------------------------
def test_job_show_follows_a_job_through_a_real_worker(redis_url: str, queue_name: str) -> None:
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        ok = q.add("square", {"x": 7})
        bad = q.add("explode", {"why": "test"})
        worker = subprocess.run(
            [
                sys.executable,
                "-m",
                "airflow_provider_chasqui.cli",
                "worker",
                "--queue",
                queue_name,
                "--handlers",
                "airflow_provider_chasqui.examples.handlers",
                "--max-jobs",
                "2",
                "--redis-url",
                redis_url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(),
        )
        assert worker.returncode == 0, worker.stderr
        waiting = q.add("greet", {"who": "w" * 5000})
        later = q.add("greet", {"who": "later"}, delay=3_600_000, job_id="later-1")

    done = json.loads(chasqui("job", "show", ok.id, "-q", queue_name, "--json", "--redis-url", redis_url).stdout)
    assert done["state"] == "completed" and done["result"] == {"x": 7, "square": 49} and done["name"] == "square"
    assert [e["e"] for e in done["events"]] == ["active", "completed"] and done["attempt"] == 1

    failed = json.loads(chasqui("job", "show", bad.id, "-q", queue_name, "--json", "--redis-url", redis_url).stdout)
    assert failed["state"] == "failed" and failed["data"] == {"why": "test"}
    assert failed["failure"]["reason"] == "unrecoverable" and "explode refuses" in failed["failure"]["detail"]
    assert failed["dlq"]["reason"] == "unrecoverable" and failed["dlq"]["dlq_id"]
    assert "dlq" in [e["e"] for e in failed["events"]]
    text = chasqui("job", "show", bad.id, "-q", queue_name, "--redis-url", redis_url).stdout
    assert "\nfailure:\n  reason: unrecoverable\n" in text and "explode refuses" in text and "dlq entry:" in text

    shown = chasqui(
        "job", "show", waiting.id, "-q", queue_name, "--max-data-bytes", "100", "--redis-url", redis_url
    ).stdout
    assert any(line.split() == ["state", "waiting"] for line in shown.splitlines())
    assert '"who": "www' in shown and "more bytes; --max-data-bytes" in shown
    delayed = json.loads(chasqui("job", "show", later.id, "-q", queue_name, "--json", "--redis-url", redis_url).stdout)
    assert delayed["state"] == "delayed" and delayed["run_at_ms"] > delayed["created_at_ms"]

    missing = chasqui("job", "show", "no-such-job", "-q", queue_name, "--redis-url", redis_url, check=False)
    assert missing.returncode == 4 and "no job 'no-such-job'" in missing.stderr


def test_get_job_details_raises_job_not_found_for_an_id_with_no_trace(
    redis_url: str, queue_name: str, r: redis.Redis
) -> None:
    """Both twins: no trace of the id is ``JobNotFound`` (a ``LookupError``), naming the search
    bounds that may have hidden the job; an id known only by an event is no such miss."""
    k = QueueKeys.for_queue(queue_name)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.add("send", {})  # the queue exists; the id below is not one of its jobs
        with pytest.raises(JobNotFound, match=f"no job 'no-such-job' on queue '{queue_name}'"):
            q.get_job_details("no-such-job")
        r.xadd(k.events, {"e": "retry-scheduled", "id": "only-events", "ts": "1", "attempt": "2"})
        shown = q.get_job_details("only-events")
        assert shown.state == "unknown" and [e["e"] for e in shown.events] == ["retry-scheduled"]

    async def twin() -> None:
        async with Queue(queue_name, redis_url=redis_url) as aq:
            with pytest.raises(LookupError, match="a wrong id or queue"):
                await aq.get_job_details("no-such-job")

    asyncio.run(twin())


def test_job_show_names_a_running_job_s_worker(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    k = QueueKeys.for_queue(queue_name)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        job = q.add("send", [1, 2, 3])
    r.xgroup_create(k.stream, "default", id="0")
    r.xreadgroup("default", "c-worker-1", {k.stream: ">"}, count=1)
    out = json.loads(chasqui("job", "show", job.id, "-q", queue_name, "--json", "--redis-url", redis_url).stdout)
    assert (out["state"], out["consumer"], out["deliveries"], out["data"]) == ("active", "c-worker-1", 1, [1, 2, 3])


# ---- chasqui scheduler / promoter ----------------------------------------------------------------
def test_scheduler_subcommand_fires_and_stops_on_sigterm(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    k = QueueKeys.for_queue(queue_name)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.upsert_repeatable_job("beat", {"b": 1}, repeat=RepeatPattern.every(300))
    proc = launch("scheduler", "--queue", queue_name, "--json", env=_env(CHASQUI_REDIS_URL=redis_url))
    try:
        wait_until_sync(lambda: r.xlen(k.stream) >= 2, 60, what="two fires from `chasqui scheduler`")
        assert r.get(k.scheduler_lock).startswith(b"s-")
    finally:
        code, out, err = stop(proc)
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["fired"] >= 2
    assert r.get(k.scheduler_lock) is None  # released on SIGTERM
    assert "RuntimeWarning" not in err


def test_promoter_subcommand_promotes_and_stops_on_sigterm(redis_url: str, queue_name: str, r: redis.Redis) -> None:
    k = QueueKeys.for_queue(queue_name)
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.add("later", {"l": 1}, delay_ms=200)
    proc = launch("promoter", "--queue", queue_name, "--poll-ms", "50", "--json", "--redis-url", redis_url)
    try:
        wait_until_sync(lambda: r.xlen(k.stream) == 1, 60, what="the delayed job promoted by `chasqui promoter`")
        assert r.zcard(k.delayed) == 0 and r.get(k.scheduler_lock) is None  # the promoter only
    finally:
        code, out, err = stop(proc)
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"queues": [queue_name], "fired": 0, "promoted": 1}
    assert r.get(k.promoter_lock) is None


# ---- rules every command follows ---------------------------------------------------------------
def _parsers(parser: argparse.ArgumentParser, path: str = "chasqui") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                if f"{path} {name}" == "chasqui worker":
                    yield "chasqui worker", worker_parser()
                else:
                    yield from _parsers(child, f"{path} {name}")


def test_every_command_and_option_has_help_text() -> None:
    missing = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                missing += [f"{path} {name}" for name in action.choices if not helps.get(name)]
            elif not action.help or action.help == argparse.SUPPRESS:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert not missing, f"no help text: {missing}"


def test_bash_completion_completes_subcommands_and_options(tmp_path: Path) -> None:
    script = tmp_path / "chasqui.bash"
    script.write_text(chasqui("completion", "bash").stdout)

    def complete(*words: str) -> list[str]:
        line = " ".join(f"'{w}'" for w in words)
        proc = subprocess.run(
            [
                "bash",
                "--norc",
                "--noprofile",
                "-c",
                f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; "
                '_chasqui_complete; printf "%s\\n" "${COMPREPLY[@]}"',
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    assert complete("chasqui", "dl") == ["dlq"]
    assert complete("chasqui", "q") == ["queues", "queue"]
    assert complete("chasqui", "dlq", "pe") == ["peek"]
    assert complete("chasqui", "queue", "drain", "myq", "--y") == ["--yes"]
    assert complete("chasqui", "job", "show", "ID", "--max-") == ["--max-data-bytes"]
    assert complete("chasqui", "worker", "--han") == ["--handlers"]
    assert json.loads(chasqui("completion", "bash", "--json").stdout)["shell"] == "bash"


COMMANDS_ON_A_QUEUE = [
    ("queues",),
    ("inspect", "{q}"),
    ("watch", "{q}", "--iterations", "1"),
    ("dlq", "peek", "{q}"),
    ("repeatable", "list", "{q}"),
    ("events", "{q}"),
    ("job", "show", "J", "-q", "{q}"),
    ("queue", "drain", "{q}", "--yes"),
    ("queue", "obliterate", "{q}", "--yes"),
    ("functions", "status"),
]


@pytest.mark.parametrize("argv", COMMANDS_ON_A_QUEUE, ids=lambda a: " ".join(a[:2]))
def test_every_command_honours_chasqui_redis_url_and_json(
    argv: tuple[str, ...], redis_url: str, queue_name: str
) -> None:
    args = [a.replace("{q}", queue_name) for a in argv]
    down = chasqui(*args, env=_env(CHASQUI_REDIS_URL="redis://127.0.0.1:1/0"), check=False)
    assert down.returncode == 3, (down.returncode, down.stderr)  # it went where the environment said
    with SyncQueue(queue_name, redis_url=redis_url) as q:
        q.add("send", 1)
    with redis.Redis.from_url(redis_url) as raw:
        raw.xadd(QueueKeys.for_queue(queue_name).events, {"e": "waiting", "id": "J", "ts": "1"})
    up = chasqui(*args, "--json", env=_env(CHASQUI_REDIS_URL=redis_url), check=False)
    assert up.returncode in (0, 4), up.stderr  # 4: job J / this version's library not there
    if up.stdout:
        for line in up.stdout.splitlines():
            json.loads(line)
    else:
        assert up.returncode == 4 and up.stderr


def test_job_show_prints_every_failure_field_a_traceback_included(
    redis_url: str, queue_name: str, r: redis.Redis
) -> None:
    """Whatever fields a worker adds to the failure record (a list's extra items, or a map) or to
    the DLQ entry are shown; a multi-line one as an indented block."""
    from airflow_provider_chasqui.core.codec import encode_data, encode_new_envelope

    k = QueueKeys.for_queue(queue_name)
    tb = 'Traceback (most recent call last):\n  File "h.py", line 3, in handler\nValueError: boom'
    r.set(
        k.failure("J-tb"),
        encode_data(["retries_exhausted", "ValueError('boom')", 1_700_000_000_000, {"traceback": tb}]),
    )
    r.xadd(
        k.dlq,
        {
            "d": encode_new_envelope("J-tb", encode_data({"a": 1}), 1_700_000_000_000),
            "n": "h",
            "source_id": "1-0",
            "reason": "retries_exhausted",
            "traceback": tb,
        },
    )
    text = chasqui("job", "show", "J-tb", "-q", queue_name, "--redis-url", redis_url).stdout
    assert any(line.split() == ["state", "failed"] for line in text.splitlines())
    assert "  reason: retries_exhausted\n  detail: ValueError('boom')\n" in text
    assert text.count('    File "h.py", line 3, in handler\n') == 2  # the record's and the DLQ entry's
    out = json.loads(chasqui("job", "show", "J-tb", "-q", queue_name, "--json", "--redis-url", redis_url).stdout)
    assert out["failure"]["traceback"] == tb and out["dlq"]["traceback"] == tb and out["data"] == {"a": 1}
