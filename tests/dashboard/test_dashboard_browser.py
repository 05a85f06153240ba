"""The standalone dashboard as a person uses it: a real ``chasqui dashboard`` process with a token,
a real ``chasqui worker``, the shared Redis, and Debian's chromium driven by Playwright.

One server, one worker and one browser for the module; the tests run in file order and each
waits on a condition with a generous deadline.  Screenshots go to a tmp dir (the path is printed);
with ``CHASQUI_DOCS_SCREENSHOTS=1`` a queue's page is also saved as docs/dashboard.png (the README's).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from servers import free_port

from airflow_provider_chasqui.core.keys import QueueKeys
from airflow_provider_chasqui.core.repeat import RepeatPattern
from airflow_provider_chasqui.sync.queue import SyncQueue

playwright_sync = pytest.importorskip("playwright.sync_api")
pytest.importorskip("fastapi", reason="the dashboard extra (fastapi, uvicorn) is not installed")
pytest.importorskip("uvicorn", reason="the dashboard extra (fastapi, uvicorn) is not installed")

pytestmark = [pytest.mark.dashboard, pytest.mark.timeout(300)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHROMIUM = os.environ.get("CHASQUI_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "dash-test-token-" + uuid.uuid4().hex
DEADLINE = 60.0


def wait_for(what: str, check: Callable[[], Any], timeout: float = DEADLINE) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def _env(redis_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["CHASQUI_REDIS_URL"] = redis_url
    return env


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


@pytest.fixture(scope="module")
def queue(shared_redis_url: str) -> Iterator[str]:
    name = f"dash-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(shared_redis_url)
    for key in client.scan_iter(match=QueueKeys.for_queue(name).prefix + "*", count=1000):
        client.delete(key)
    client.close()


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard")


@pytest.fixture(scope="module")
def server(shared_redis_url: str, queue: str, tmp: Path) -> Iterator[dict[str, Any]]:
    port = free_port()
    log = tmp / "dashboard.log"
    env = _env(shared_redis_url) | {"CHASQUI_DASHBOARD_TOKEN": TOKEN}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_provider_chasqui.cli", "dashboard", "--port", str(port), "--queue", queue],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(ROOT),
        )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(url + "/static/dashboard.css", timeout=2):
                return True
        except (urllib.error.URLError, OSError):
            return False

    try:
        wait_for("the dashboard to answer", up)
        yield {"url": url, "proc": proc, "log": log}
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def worker(shared_redis_url: str, queue: str, tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    with open(tmp / "worker.log", "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airflow_provider_chasqui.cli",
                "worker",
                "--queue",
                queue,
                "--handlers",
                "dash_handlers",
                "--redis-url",
                shared_redis_url,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=_env(shared_redis_url),
            cwd=str(tmp),
        )
    try:
        yield proc
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def q(shared_redis_url: str, queue: str) -> Iterator[SyncQueue]:
    with SyncQueue(queue, redis_url=shared_redis_url) as sq:
        yield sq


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    with playwright_sync.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def _context(browser: Any) -> Any:
    context = browser.new_context(viewport={"width": 1400, "height": 900}, timezone_id="America/Lima")
    context.set_default_timeout(30_000)
    return context


def _log_in(p: Any, server: dict[str, Any]) -> None:
    p.goto(server["url"] + "/login")
    p.fill("input[name=token]", TOKEN)
    p.click("button")
    p.locator("table.queues").wait_for()


@pytest.fixture(scope="module")
def page(browser: Any, server: dict[str, Any]) -> Iterator[Any]:
    """A signed-in page, whichever test of the module runs first (a shuffled order ran the
    others before the login test, on the sign-in page: issue 29)."""
    context = _context(browser)
    p = context.new_page()
    _log_in(p, server)
    yield p
    context.close()


def shot(page: Any, tmp: Path, name: str) -> None:
    page.screenshot(path=str(tmp / f"{name}.png"), full_page=True)


def confirm(page: Any) -> str:
    """Press the confirmation page's button; the flash message that follows."""
    page.locator(".confirm-what").wait_for()
    page.click("#confirm")
    return page.locator(".flash").inner_text()


# ---- the command line ------------------------------------------------------------------------
def test_refuses_a_public_address_without_credentials(shared_redis_url: str) -> None:
    env = {k: v for k, v in _env(shared_redis_url).items() if not k.startswith("CHASQUI_DASHBOARD_")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_provider_chasqui.cli",
            "dashboard",
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "refusing to serve the dashboard on 0.0.0.0" in proc.stderr and "--token" in proc.stderr


def test_short_token_is_refused(shared_redis_url: str) -> None:
    env = _env(shared_redis_url) | {"CHASQUI_DASHBOARD_TOKEN": "short"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "airflow_provider_chasqui.cli",
            "dashboard",
            "--host",
            "0.0.0.0",
            "--port",
            str(free_port()),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "at least 16 characters" in proc.stderr


# ---- token auth ------------------------------------------------------------------------------
def test_pages_need_the_token(server: dict[str, Any]) -> None:
    for path in ("/", "/dlq?queue=x", "/api/queues"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server["url"] + path, timeout=10)
        assert err.value.code == 401
        err.value.close()
    err.value.close()
    req = urllib.request.Request(server["url"] + "/api/queues", headers={"Authorization": "Bearer wrong-token-123456"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 401
    err.value.close()
    req = urllib.request.Request(server["url"] + "/api/queues", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
    with pytest.raises(urllib.error.HTTPError) as err:  # a change without the form's check value
        urllib.request.urlopen(
            urllib.request.Request(
                server["url"] + "/dlq/action",
                data=b"queue=x&action=purge",
                headers={"Authorization": f"Bearer {TOKEN}"},
            ),
            timeout=10,
        )
    assert err.value.code == 403
    err.value.close()


def test_login_then_queues_page(browser: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path) -> None:
    job = q.add("square", {"x": 7})
    assert q.wait_for_result(job.id, timeout=DEADLINE) == {"square": 49}
    context = _context(browser)  # a browser that has not signed in yet
    page = context.new_page()
    page.goto(server["url"] + "/")
    assert "token is required" in page.content()
    _log_in(page, server)
    row = page.locator("table.queues tr", has_text=q.name)
    assert row.count() == 1
    assert row.locator("svg.chart").count() == 1
    shot(page, tmp, "queues")
    page.click(f"table.queues a:text-is('{q.name}')")
    page.locator("h2", has_text=f"Queue {q.name}").wait_for()
    # the last 10 minutes (events), the last hour and the last week (the history workers write
    # with their beat): each with an axis of times and its totals
    assert page.locator("figure.history svg.chart").count() == 3
    assert page.locator("figure.history svg.chart text.x").count() == 15

    def hour_caption() -> str | None:
        page.reload()
        text = page.locator("figure.history figcaption").nth(1).inner_text()
        return text if "last hour per minute: 1 completed" in text else None

    wait_for("the worker's history beat", hour_caption, DEADLINE)
    week = page.locator("figure.history figcaption").nth(2).inner_text()
    assert "last 7 days per hour: 1 completed (up), 0 failed" in week, week
    # the live refresh swaps the numbers in without a reload
    wait_for("a live refresh", lambda: page.locator("[data-live]").get_attribute("data-refreshed"), 30)
    shot(page, tmp, "queue")
    context.close()


def test_job_page_shows_result_and_timeline(
    page: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path
) -> None:
    job = q.add("square", {"x": 12})
    assert q.wait_for_result(job.id, timeout=DEADLINE) == {"square": 144}
    page.goto(server["url"] + "/job")
    page.fill("input[name=queue]", q.name)
    page.fill("input[name=id]", job.id)
    page.click("form.lookup button")
    page.locator("b.state").wait_for()
    assert page.locator("b.state").inner_text() == "completed"
    assert '"square": 144' in page.locator("pre.result").inner_text()
    events = page.locator("table.timeline").inner_text()
    assert "completed" in events
    # the viewer's zone (no Airflow choice on this origin: the browser's), in Airflow's format
    assert re.search(r"\n\d{4}-\d\d-\d\d \d\d:\d\d:\d\d GMT-5\tcompleted", events), events
    shot(page, tmp, "job")


def _dead_letter(q: SyncQueue, tmp: Path, n: int, tag: str) -> list[str]:
    before = int(
        q.driver.call(
            __import__("airflow_provider_chasqui.core.calls", fromlist=["command"]).command("XLEN", q.keys.dlq)
        )
    )
    ids = [q.add("gated", {"gate": str(tmp / f"gate-{tag}-{i}"), "n": i}).id for i in range(n)]
    wait_for(f"{n} jobs in the DLQ", lambda: len([r for r in q.peek_dlq(1000) if r["job_id"] in ids]) == n)
    assert before >= 0
    return ids


def test_dlq_filter_view_and_replay_one(
    page: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path
) -> None:
    (job_id,) = _dead_letter(q, tmp, 1, "one")
    page.goto(server["url"] + f"/dlq?queue={q.name}")
    page.fill("input[name=reason]", "unrecoverable")
    page.fill("input[name=name]", "gated")
    page.click("form.filter button")
    row = page.locator("table.dlq tr", has_text=job_id)
    row.wait_for()
    assert "gate closed" in row.inner_text()
    shot(page, tmp, "dlq")
    row.locator("a", has_text="view").click()
    assert "gate-one-0" in page.locator("pre.data").inner_text()
    shot(page, tmp, "dlq-entry")
    gate = str(tmp / "gate-one-0")
    Path(gate).write_text("open")
    page.locator("form.inline button", has_text="replay").first.click()
    assert "Replay 1 DLQ entry" in page.locator(".confirm-what").inner_text()
    shot(page, tmp, "confirm")
    assert confirm(page) == "replayed 1 of 1 entries"
    assert q.wait_for_result(job_id, timeout=DEADLINE) == {"passed": gate, "n": 0}
    page.goto(server["url"] + f"/job?queue={q.name}&id={job_id}")
    assert page.locator("b.state").inner_text() == "completed"
    assert "dlq" in page.locator("table.timeline").inner_text()
    log = server["log"].read_text()
    # the server's log is shared by the module's tests (in any order): this replay's own line
    lines = [x for x in log.splitlines() if "chasqui dashboard audit" in x and "action=dlq.replay " in x]
    assert any('user="token"' in x and f'queue="{q.name}"' in x and "replayed=1" in x for x in lines), lines


def test_dlq_replay_selected_remove_and_purge(
    page: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path
) -> None:
    ids = _dead_letter(q, tmp, 4, "many")
    rows = {r["job_id"]: r["dlq_id"] for r in q.peek_dlq(1000) if r["job_id"] in ids}
    for i in (0, 1):
        Path(tmp / f"gate-many-{i}").write_text("open")
    page.goto(server["url"] + f"/dlq?queue={q.name}&name=gated")
    for i in (0, 1):
        page.check(f"input[name=ids][value='{rows[ids[i]]}']")
    page.click("#dlq-selected button[value=replay]")
    assert "Replay 2 DLQ entries" in page.locator(".confirm-what").inner_text()
    assert confirm(page) == "replayed 2 of 2 entries"
    for i in (0, 1):
        assert q.wait_for_result(ids[i], timeout=DEADLINE)["n"] == i
    # remove one: a cancelled confirmation leaves it there
    page.goto(server["url"] + f"/dlq?queue={q.name}&name=gated")
    page.check(f"input[name=ids][value='{rows[ids[2]]}']")
    page.click("#dlq-selected button[value=remove]")
    page.click("text=Cancel")
    assert page.locator("table.dlq tr", has_text=ids[2]).count() == 1
    page.check(f"input[name=ids][value='{rows[ids[2]]}']")
    page.click("#dlq-selected button[value=remove]")
    assert confirm(page) == "removed 1 of 1 entries"
    assert ids[2] not in [r["job_id"] for r in q.peek_dlq(1000)]
    # purge everything named gated
    page.goto(server["url"] + f"/dlq?queue={q.name}&name=gated")
    page.click("button:text-is('purge all matching')")
    assert "name = 'gated'" in page.locator(".confirm-what").inner_text()
    assert confirm(page) == "purged 1 entries"
    assert not [r for r in q.peek_dlq(1000) if r["name"] == "gated"]
    assert page.locator("table.dlq td.empty").count() == 1
    log = server["log"].read_text()
    for action in ("dlq.remove", "dlq.purge"):
        assert f"action={action}" in log


def test_dlq_replay_all_matching(page: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path) -> None:
    ids = _dead_letter(q, tmp, 3, "all")
    for i in range(3):
        Path(tmp / f"gate-all-{i}").write_text("open")
    page.goto(server["url"] + f"/dlq?queue={q.name}&reason=unrecoverable")
    page.click("button:text-is('replay all matching')")
    assert confirm(page) == "replayed 3 entries"
    for i in range(3):
        assert q.wait_for_result(ids[i], timeout=DEADLINE)["n"] == i


def _fired(q: SyncQueue, key: str) -> int:
    info = q.get_repeatable_job(key)
    assert info is not None
    return info.fired


def test_schedules_pause_stops_firing_then_resume_trigger_remove(
    page: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path
) -> None:
    q.upsert_repeatable_job("tick", {"spec": "a"}, repeat=RepeatPattern.every(500), key="tick-a")
    q.upsert_repeatable_job("tick", {"spec": "control"}, repeat=RepeatPattern.every(500), key="tock-control")
    q.upsert_repeatable_job(
        "tick", {"spec": "cron"}, repeat=RepeatPattern.cron("0 9 * * *", tz="Asia/Tokyo"), key="tock-cron"
    )
    wait_for("tick-a to fire", lambda: _fired(q, "tick-a") >= 1)
    page.goto(server["url"] + f"/schedules?queue={q.name}")
    page.fill("input[name=prefix]", "tick")
    page.click("form.filter button")
    rows = page.locator("table.specs tbody tr")
    assert rows.count() == 1 and "tick-a" in rows.inner_text()
    evil = "tock-<img src=x onerror=alert(1)>"
    q.upsert_repeatable_job(
        "tick", {"spec": "<script>alert(2)</script>"}, repeat=RepeatPattern.every(3_600_000), key=evil
    )
    page.goto(server["url"] + f"/schedules?queue={q.name}&prefix=tock-%3C")
    assert page.locator("table.specs img").count() == 0 and evil in page.locator("table.specs").inner_text()
    q.remove_repeatable_by_key(evil)
    page.goto(server["url"] + f"/schedules?queue={q.name}&prefix=tock-c")
    cron_row = page.locator("table.specs tr", has_text="tock-cron").inner_text()
    assert "09:00:00 JST" in cron_row and "19:00:00 GMT-5" in cron_row and "Asia/Tokyo" in cron_row
    shot(page, tmp, "schedules")
    page.goto(server["url"] + f"/schedules?queue={q.name}&prefix=tick-a")
    page.locator("table.specs tr", has_text="tick-a").locator("button", has_text="pause").click()
    assert confirm(page) == "paused tick-a"
    assert "paused" in page.locator("table.specs tr", has_text="tick-a").inner_text()
    fired = _fired(q, "tick-a")
    control = _fired(q, "tock-control")
    wait_for("the control spec to fire 3 more times", lambda: _fired(q, "tock-control") >= control + 3)
    assert _fired(q, "tick-a") == fired  # paused: it did not fire while the control fired
    page.goto(server["url"] + f"/schedules?queue={q.name}&prefix=tick-a")
    page.locator("table.specs tr", has_text="tick-a").locator("button", has_text="resume").click()
    assert confirm(page) == "resumed tick-a"
    wait_for("tick-a to fire again", lambda: _fired(q, "tick-a") > fired)
    page.goto(server["url"] + f"/schedules?queue={q.name}&prefix=tock-cron")
    page.locator("table.specs tr", has_text="tock-cron").locator("button", has_text="trigger").click()
    message = confirm(page)
    job_id = re.fullmatch(r"fired tock-cron now: job (\S+)", message).group(1)
    assert q.wait_for_result(job_id, timeout=DEADLINE) == {"tick": {"spec": "cron"}}
    for key in ("tick-a", "tock-control", "tock-cron"):
        page.goto(server["url"] + f"/schedules?queue={q.name}&prefix={key}")
        page.locator("table.specs tr", has_text=key).locator("button", has_text="remove").click()
        assert confirm(page) == f"removed {key}"
        assert q.get_repeatable_job(key) is None
    log = server["log"].read_text()
    for action in ("spec.pause", "spec.resume", "spec.trigger", "spec.remove"):
        assert f"action={action}" in log


def test_queue_pause_and_resume_from_the_queue_page(
    page: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path
) -> None:
    """Issue 24: the queue page pauses and resumes the queue behind a confirmation, audited;
    the real worker starts nothing while it is paused and runs the job once it is resumed;
    the page shows the limits the workers obey."""
    q.set_concurrency(3)
    page.goto(server["url"] + f"/queue?queue={q.name}")
    assert "0 of 3 slots held" in page.locator("table.kv").inner_text()
    page.locator("table.kv button", has_text="Pause queue").click()
    assert "Pause (no worker starts a new job" in page.locator(".confirm-what").inner_text()
    assert confirm(page) == f"{q.name} is paused"
    assert q.is_paused()
    assert "paused: no worker starts its jobs" in page.locator("table.kv").inner_text()
    page.goto(server["url"] + "/")  # the Queues page lists the limits too
    limits = page.locator("table.queues tr", has_text=q.name).locator("td").nth(10).inner_text()
    assert limits == "paused\n0/3 running", limits
    job = q.add("square", {"x": 3})
    time.sleep(1.5)  # longer than the workers' 100 ms controls cache and a few pause polls (a hold, not a wait)
    assert q.get_job_state(job.id) != "completed"
    page.goto(server["url"] + f"/queue?queue={q.name}")
    page.locator("table.kv button", has_text="Resume queue").click()
    assert confirm(page) == f"{q.name} is running"
    assert q.wait_for_result(job.id, timeout=DEADLINE) == {"square": 9}
    q.clear_concurrency()
    log = server["log"].read_text()
    assert f'queue="{q.name}" action=queue.pause paused=true' in log
    assert f'queue="{q.name}" action=queue.resume paused=false' in log


def test_cancel_a_delayed_and_a_running_job_from_the_job_page(
    page: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path
) -> None:
    """Issue 25: the job page shows a running job's progress as a bar, and cancels a delayed job
    and a running one behind a confirmation, audited; the running one's async handler (in the
    real ``chasqui worker``) is stopped within 2 s, and neither is retried nor dead-lettered."""
    later = q.add("square", {"x": 1}, delay=600.0)
    page.goto(server["url"] + f"/job?queue={q.name}&id={later.id}")
    page.locator("table.kv button", has_text="Cancel job").click()
    assert "Cancel (never retried" in page.locator(".confirm-what").inner_text()
    assert confirm(page) == f"job {later.id}: cancel cancelled"
    assert q.get_job_state(later.id) == "cancelled"
    assert "cancelled" in page.locator("b.state").inner_text()
    assert page.locator("table.kv button", has_text="Cancel job").count() == 0
    running = q.add("sleepy", {"secs": 60})
    wait_for("the sleepy job to report", lambda: q.get_job_details(running.id).progress == 50)
    page.goto(server["url"] + f"/job?queue={q.name}&id={running.id}")
    assert page.locator("progress.job-progress").get_attribute("value") == "50"  # its progress, as a bar
    page.locator("table.kv button", has_text="Cancel job").click()
    started = time.monotonic()
    assert confirm(page) == f"job {running.id}: cancel requested"
    wait_for("the running job to end cancelled", lambda: q.get_job_state(running.id) == "cancelled")
    assert time.monotonic() - started < 2 + 1  # 2 s, and a second for the browser's round trip
    assert all(e.get("job_id") != running.id for e in q.peek_dlq(100))
    log = server["log"].read_text()
    assert f"action=job.cancel job_id={later.id} state=cancelled" in log.replace('"', "")
    assert f"action=job.cancel job_id={running.id} state=requested" in log.replace('"', "")
    shot(page, tmp, "cancel")


def test_remove_a_job_and_clean_a_state_from_the_pages(
    page: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path
) -> None:
    """chasquimq's ``Queue.remove`` and ``clean`` from the pages, each behind a confirmation and
    audited: a delayed job's page removes it; a running job's page offers no removal (a job a
    worker read stays); the queue page cleans stored results, up to a limit; a bad grace is
    refused naming the field, and cleans nothing."""
    later = q.add("square", {"x": 4}, delay=600.0)
    page.goto(server["url"] + f"/job?queue={q.name}&id={later.id}")
    page.locator("table.kv button", has_text="Remove job").click()
    assert "Remove (its delayed" in page.locator(".confirm-what").inner_text()
    assert confirm(page) == f"job {later.id}: removed from delayed"
    assert q.get_job_state(later.id) == "unknown"
    running = q.add("sleepy", {"secs": 60})
    wait_for("the sleepy job to run", lambda: q.get_job_state(running.id) == "active")
    page.goto(server["url"] + f"/job?queue={q.name}&id={running.id}")
    assert page.locator("table.kv button", has_text="Cancel job").count() == 1
    assert page.locator("table.kv button", has_text="Remove job").count() == 0
    q.cancel(running.id)
    done = [q.add("square", {"x": i}) for i in range(3)]
    for job in done:
        assert q.wait_for_result(job.id, timeout=DEADLINE) == {"square": int(job.data["x"]) ** 2}
    _clean(page, server["url"] + f"/queue?queue={q.name}", "completed", "-5", "1000")
    assert "grace_ms must be a whole number" in page.locator("p.error").inner_text()
    assert [q.get_job_result(job.id) is not None for job in done] == [True] * 3
    _clean(page, server["url"] + f"/queue?queue={q.name}", "completed", "0", "1")
    assert "older than 0 ms" in page.locator(".confirm-what").inner_text()
    assert confirm(page) == "cleaned 1 completed jobs"
    _clean(page, server["url"] + f"/queue?queue={q.name}", "completed", "0", "0")
    assert re.fullmatch(r"cleaned \d+ completed jobs", confirm(page))
    assert q.get_job_result_bulk([job.id for job in done]) == [None] * 3  # their stored results deleted
    log = server["log"].read_text().replace('"', "")
    assert f"action=job.remove job_id={later.id} removed=[delayed]" in log
    assert "action=queue.clean state=completed grace_ms=0 limit=1 cleaned=1" in log
    shot(page, tmp, "clean")


def _clean(page: Any, queue_page: str, state: str, grace_ms: str, limit: str) -> None:
    """Fill the queue page's clean form and send it (the confirmation, or an error, follows)."""
    page.goto(queue_page)
    form = page.locator("form.clean")
    form.locator("select[name=state]").select_option(state)
    form.locator("input[name=grace_ms]").fill(grace_ms)
    form.locator("input[name=limit]").fill(limit)
    form.locator("button", has_text="Clean").click()


def test_workers_page(page: Any, server: dict[str, Any], q: SyncQueue, worker: Any, tmp: Path) -> None:
    # shuffled, this can be the module's first test: Redis 7.0 lists a consumer only once it
    # was delivered an entry, so the worker runs one job first
    job = q.add("square", {"x": 2})
    assert q.wait_for_result(job.id, timeout=DEADLINE) == {"square": 4}
    page.goto(server["url"] + "/")
    page.click("nav a:text-is('Workers')")  # no queue chosen yet: the page offers them
    page.click(f"ul.pick a:text-is('{q.name}')")
    page.locator("h2", has_text=f"Workers of {q.name}").wait_for()
    consumers = page.locator("table.consumers").inner_text()
    assert re.search(r"\n\S+\talive\t0\t", consumers), consumers  # one consumer, beating, nothing pending
    fleet = page.locator("table.fleet").inner_text()  # issue 28: who the worker is
    assert re.search(r"\nc-[^\t]+-\d+-[0-9a-f]{8}\talive\t", fleet), fleet
    assert "gated, sleepy, square, tick" in fleet and "\tok\t0" in fleet, fleet  # no handler left running
    assert "health\tleft running" in fleet, fleet
    locks = page.locator("table.locks").inner_text()
    wait_for(
        "the worker to hold the scheduler lock",
        lambda: q.driver.call(
            __import__("airflow_provider_chasqui.core.calls", fromlist=["command"]).command(
                "GET", q.keys.scheduler_lock
            )
        ),
    )
    page.reload()
    locks = page.locator("table.locks").inner_text()
    assert "scheduler" in locks and "promoter" in locks
    holder = q.driver.call(
        __import__("airflow_provider_chasqui.core.calls", fromlist=["command"]).command("GET", q.keys.scheduler_lock)
    ).decode()
    assert holder in locks
    shot(page, tmp, "workers")
    if os.environ.get("CHASQUI_DOCS_SCREENSHOTS") == "1":  # the README's picture, after every test's traffic
        page.goto(server["url"] + f"/queue?queue={q.name}")
        page.locator("svg.chart").wait_for()
        page.screenshot(path=str(ROOT / "docs" / "dashboard.png"))
    print(f"screenshots in {tmp}")


def test_basic_auth_server(shared_redis_url: str, browser: Any, tmp: Path, q: SyncQueue) -> None:
    port = free_port()
    env = {k: v for k, v in _env(shared_redis_url).items() if not k.startswith("CHASQUI_DASHBOARD_")}
    env["CHASQUI_DASHBOARD_BASIC_AUTH"] = "ana:s3cret-pass"
    with open(tmp / "basic.log", "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "airflow_provider_chasqui.cli",
                "dashboard",
                "--port",
                str(port),
                "--host",
                "127.0.0.1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(ROOT),
        )
    url = f"http://127.0.0.1:{port}"
    try:

        def answers() -> int | None:
            assert proc.poll() is None, (tmp / "basic.log").read_text()
            try:
                urllib.request.urlopen(url + "/", timeout=5).close()
                return 200
            except urllib.error.HTTPError as err:
                err.close()
                return err.code if err.headers.get("WWW-Authenticate") == 'Basic realm="chasqui"' else None
            except (urllib.error.URLError, OSError):
                return None

        assert wait_for("the basic-auth dashboard", answers) == 401
        context = browser.new_context(http_credentials={"username": "ana", "password": "s3cret-pass"})
        page = context.new_page()
        page.goto(url + f"/queue?queue={q.name}")
        assert page.locator("h2").inner_text() == f"Queue {q.name}"
        assert page.locator("span.user").inner_text() == "ana"
        context.close()
        wrong = browser.new_context(http_credentials={"username": "ana", "password": "nope"})
        resp = wrong.new_page().goto(url + "/")
        assert resp is not None and resp.status == 401
        wrong.close()
    finally:
        _stop(proc)


def test_search_page_finds_jobs_by_name_state_and_field(
    page: Any, server: dict[str, Any], q: SyncQueue, tmp: Path
) -> None:
    """Issue 28: the Search page (a delayed job, so the module's worker leaves it alone) by a
    data field with a hostile value, then by id straight to the job's page."""
    evil = "<img src=x onerror=alert(1)>"
    job = q.add("later", {"customer": {"id": evil}}, delay=3_600_000)
    decoy = q.add("later", {"customer": {"id": "someone else"}}, delay=3_600_000)
    try:
        page.goto(server["url"] + f"/search?queue={q.name}")
        page.fill("form.search input[name=field]", "customer.id")
        page.fill("form.search input[name=value]", evil)
        page.select_option("form.search select[name=state]", "delayed")
        page.click("form.search button")
        found = page.locator("table.found").inner_text()
        assert job.id in found and decoy.id not in found and "delayed" in found, found
        assert page.locator("img").count() == 0
        shot(page, tmp, "search")
        page.fill("form.search input[name=id]", decoy.id)
        page.click("form.search button")
        page.locator("h2", has_text=decoy.id).wait_for()
        assert page.locator("b.state").inner_text() == "delayed"
    finally:
        q.cancel(job.id)
        q.cancel(decoy.id)
