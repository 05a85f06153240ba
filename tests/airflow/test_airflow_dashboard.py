"""The dashboard inside Airflow: ``airflow plugins`` lists it, a real ``airflow api-server`` serves it at
/chasqui to logged-in users (simple auth manager, JWTs from /auth/token), one page per ``chasqui``
connection, viewers may look but get 403 on a change, editors may change; Chromium opens it with
the session cookie the Airflow UI uses.

One private AIRFLOW_HOME, one api-server and one browser for the module.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from airflow_support import conn_json
from servers import free_port

from airflow_provider_chasqui.core.history import MinuteCounts
from airflow_provider_chasqui.sync.queue import SyncQueue

pytestmark = [pytest.mark.airflow, pytest.mark.dashboard, pytest.mark.timeout(400)]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHROMIUM = os.environ.get("CHASQUI_CHROMIUM", "/usr/bin/chromium")
USERS = {"boss": "admin", "olga": "op", "vic": "viewer"}
LINKS_DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_provider_chasqui.operators.enqueue import ChasquiEnqueueOperator
from airflow_provider_chasqui.operators.repeatable import ChasquiUpsertRepeatableOperator

with DAG("chasqui_dash_links", schedule=None, start_date=datetime(2024, 1, 1), catchup=False):
    ChasquiEnqueueOperator(task_id="enqueue", job_name="square", data={{"x": 3}}, queue_name="{queue}",
                           chasqui_conn_id="chasqui_a")
    ChasquiUpsertRepeatableOperator(task_id="spec", job_name="tick", cron="0 9 * * *", tz="Asia/Tokyo",
                                    key="dash-link-spec", queue_name="{queue}", chasqui_conn_id="chasqui_a")
"""


def _entry_point_shim(tmp: Path) -> list[str]:
    """pyproject declares the ``airflow.plugins`` entry point; an environment installed before it
    existed (an editable install) lacks it: a dist-info declaring the same entry point stands in."""
    if any(ep.name == "chasqui_dashboard" for ep in entry_points(group="airflow.plugins")):
        return []
    import tomllib

    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["airflow.plugins"]
    info = tmp / "shim" / "chasqui_dashboard_entry_point-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: chasqui-dashboard-entry-point\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[airflow.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in target.items()))
    return [str(tmp / "shim")]


def _request(
    url: str, token: str | None = None, data: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, str]:
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read().decode()


@pytest.fixture(scope="module")
def queue(redis_url: str) -> Iterator[str]:
    name = f"dash-af-{uuid.uuid4().hex[:8]}"
    with SyncQueue(name, redis_url=redis_url) as q:
        q.add("square", {"x": 2})
    yield name
    from airflow_support import delete_queue_keys

    delete_queue_keys(redis_url, name)


@pytest.fixture(scope="module")
def af(
    airflow_home: dict[str, str], redis_url: str, tmp_path_factory: pytest.TempPathFactory, queue: str
) -> Iterator[dict[str, Any]]:
    home = tmp_path_factory.mktemp("af-dash")
    shutil.copy(Path(airflow_home["AIRFLOW_HOME"]) / "airflow.db.migrated", home / "airflow.db")
    (home / "dags").mkdir()
    passwords = {u: secrets.token_urlsafe(12) for u in USERS}
    (home / "passwords.json").write_text(json.dumps(passwords))
    port = free_port()
    env = {k: v for k, v in airflow_home.items() if not k.startswith("AIRFLOW_CONN_")}
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "PYTHONPATH": os.pathsep.join([*_entry_point_shim(home), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        }
    )
    (home / "dags" / "chasqui_dash_links.py").write_text(LINKS_DAG.format(queue=queue))
    for conn_id in ("chasqui_a", "chasqui_b"):
        proc = subprocess.run(
            [sys.executable, "-m", "airflow", "connections", "add", conn_id, "--conn-json", conn_json(redis_url)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    log = home / "api-server.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            # two workers, as production runs it: a form rendered by one is posted to the other
            [sys.executable, "-m", "airflow", "api-server", "--port", str(port), "--workers", "2"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert server.poll() is None, log.read_text()[-4000:]
            try:
                if _request(base + "/api/v2/monitor/health")[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, "api-server did not answer: " + log.read_text()[-4000:]
            time.sleep(0.5)
        tokens = {}
        for user, pw in passwords.items():
            status, body = _request(
                base + "/auth/token",
                data=json.dumps({"username": user, "password": pw}).encode(),
                headers={"Content-Type": "application/json"},
            )
            assert status == 201, body
            tokens[user] = json.loads(body)["access_token"]
        yield {"env": env, "base": base, "tokens": tokens, "log": log, "home": home}
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, 9)
                server.wait(timeout=30)


def test_airflow_plugins_lists_the_dashboard(af: dict[str, Any]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", "plugins", "--output", "json"],
        env=af["env"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    (plugin,) = [p for p in json.loads(proc.stdout[proc.stdout.index("[") :]) if p["name"] == "chasqui_dashboard"]
    assert plugin["fastapi_apps"] and plugin["external_views"]
    status, body = _request(af["base"] + "/api/v2/plugins", af["tokens"]["vic"])
    assert status == 200
    (listed,) = [p for p in json.loads(body)["plugins"] if p["name"] == "chasqui_dashboard"]
    (view,) = listed["external_views"]
    assert view["name"] == "Chasqui" and view["href"] == "/chasqui/" and view["destination"] == "nav"


def test_logged_in_users_see_every_connection(af: dict[str, Any], queue: str) -> None:
    status, body = _request(af["base"] + "/chasqui/")
    assert status == 401
    for user in USERS:
        status, body = _request(af["base"] + f"/chasqui/queue?src=chasqui_b&queue={queue}", af["tokens"][user])
        assert status == 200, body
        assert f"Queue {queue}" in body and "chasqui_a" in body and "chasqui_b" in body  # the picker
    status, body = _request(af["base"] + f"/chasqui/dlq?src=chasqui_a&queue={queue}", af["tokens"]["boss"])
    assert status == 200 and "purge all matching" in body
    status, body = _request(af["base"] + f"/chasqui/dlq?src=chasqui_a&queue={queue}", af["tokens"]["vic"])
    assert status == 200 and "purge all matching" not in body  # a viewer is shown no buttons


def _csrf(body: str) -> str:
    marker = 'name="csrf" value="'
    return body[body.index(marker) + len(marker) :].split('"', 1)[0]


def test_viewer_gets_403_on_replay_and_editor_may_change(af: dict[str, Any], queue: str) -> None:
    form = f"queue={queue}&action=replay_matching&confirmed=1".encode()
    status, body = _request(af["base"] + "/chasqui/dlq/action?src=chasqui_a", af["tokens"]["vic"], data=form)
    assert status == 403 and "may not change" in body
    status, page = _request(af["base"] + f"/chasqui/dlq?src=chasqui_a&queue={queue}", af["tokens"]["olga"])
    status, body = _request(
        af["base"] + "/chasqui/dlq/action?src=chasqui_a",
        af["tokens"]["olga"],
        data=form + f"&csrf={_csrf(page)}".encode(),
    )
    assert status == 200 and "replayed 0 entries" in body  # followed the redirect to the DLQ page
    assert 'user="olga"' in af["log"].read_text()  # the audit line names the Airflow user


def test_changes_succeed_whichever_api_server_worker_answers(af: dict[str, Any], queue: str) -> None:
    """Issue 26, item 5: the form's check value was keyed by a per-process random secret, so with
    ``--workers 2`` a change failed whenever the page and the post reached different workers (11
    of 20 refused).  It now derives from Airflow's shared ``[api] secret_key``."""
    outcomes = []
    for _ in range(20):
        status, page = _request(af["base"] + f"/chasqui/dlq?src=chasqui_a&queue={queue}", af["tokens"]["olga"])
        assert status == 200, page
        form = f"queue={queue}&action=replay_matching&confirmed=1&csrf={_csrf(page)}".encode()
        status, body = _request(af["base"] + "/chasqui/dlq/action?src=chasqui_a", af["tokens"]["olga"], data=form)
        outcomes.append(status)
        assert status == 200 and "replayed 0 entries" in body, (outcomes, body[:500])
    assert outcomes == [200] * 20
    started = set(re.findall(r"Started server process \[(\d+)\]", af["log"].read_text()))
    assert len(started) >= 2, "the api-server did not run two workers"


def test_browser_with_the_airflow_session(af: dict[str, Any], queue: str, tmp_path: Path) -> None:
    playwright_sync = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.add_cookies([{"name": "_token", "value": af["tokens"]["boss"], "url": af["base"]}])
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto(af["base"] + "/chasqui/?src=chasqui_a")
            page.locator("table.queues").wait_for()
            page.locator("table.queues a", has_text=queue).first.wait_for()
            page.select_option("select[name=src]", "chasqui_b")
            page.wait_for_url("**src=chasqui_b**")
            page.click(f"table.queues a:text-is('{queue}')")
            page.locator("h2", has_text=f"Queue {queue}").wait_for()
            page.click("nav a:text-is('Schedules')")
            page.locator("h2", has_text=f"Schedules of {queue}").wait_for()
            page.screenshot(path=str(tmp_path / "airflow-chasqui.png"), full_page=True)
        finally:
            browser.close()


def test_extra_links_from_finished_tasks_open_the_job_and_spec_pages(
    af: dict[str, Any], queue: str, tmp_path: Path
) -> None:
    from airflow_support import run_dags

    (run,) = run_dags(af["env"], [["chasqui_dash_links", {}]])
    assert run["state"] == "success", run["log"][-3000:]
    job_id = run["xcom"]["enqueue.return_value"]
    job_link = run["xcom"]["enqueue._link_ChasquiJobLink"]
    # issue 28: the links open the page inside Airflow's shell (the plugin's view frames /chasqui/...)
    assert job_link == f"/plugin/chasqui/chasqui/job?src=chasqui_a&queue={queue}&id={job_id}"
    spec_link = run["xcom"]["spec._link_ChasquiScheduleLink"]
    assert spec_link == f"/plugin/chasqui/chasqui/schedules?src=chasqui_a&queue={queue}&prefix=dash-link-spec"
    # the UI asks the API for a task's links: the api-server deserialises them from the DAG
    status, body = _request(af["base"] + "/api/v2/dags/chasqui_dash_links/dagRuns", af["tokens"]["vic"])
    assert status == 200, body
    (run_id,) = [r["dag_run_id"] for r in json.loads(body)["dag_runs"]]
    status, body = _request(
        af["base"] + f"/api/v2/dags/chasqui_dash_links/dagRuns/{run_id}/taskInstances/enqueue/links",
        af["tokens"]["vic"],
    )
    assert status == 200, body
    assert json.loads(body)["extra_links"]["Chasqui job"] == job_link, body
    playwright_sync = pytest.importorskip("playwright.sync_api")
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.add_cookies([{"name": "_token", "value": af["tokens"]["vic"], "url": af["base"]}])
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto(af["base"] + job_link)
            frame = page.frame_locator("iframe[title='Chasqui']")  # inside Airflow's UI, not instead of it
            assert job_id in frame.locator("h2").inner_text()
            assert '"x": 3' in frame.locator("pre.data").inner_text()
            assert page.url.startswith(af["base"] + "/plugin/chasqui/chasqui/job?")  # the shell keeps the address
            # and back: the job and the spec name the DAG run and task that made them, linked to
            # the task instance's page in the whole window
            back = frame.locator("table.kv a.origin")
            assert back.inner_text() == f"chasqui_dash_links / {run_id} / enqueue"
            assert back.get_attribute("target") == "_top"
            back.click()
            page.wait_for_url(re.compile(r".*/dags/chasqui_dash_links/runs/.+/tasks/enqueue$"))
            page.wait_for_function("!document.querySelector(\"iframe[title='Chasqui']\")")  # Airflow's page now
            page.get_by_text("enqueue").first.wait_for()
            page.screenshot(path=str(tmp_path / "origin-task-instance.png"))
            page.goto(af["base"] + spec_link)
            frame = page.frame_locator("iframe[title='Chasqui']")
            spec_back = frame.locator("table.specs tr", has_text="dash-link-spec").locator("a.origin")
            assert spec_back.inner_text() == f"chasqui_dash_links / {run_id} / spec"
            row = frame.locator("table.specs tr", has_text="dash-link-spec").inner_text()
            assert "09:00:00 JST" in row and "active" in row
            page.screenshot(path=str(tmp_path / "extra-link-spec.png"), full_page=True)
        finally:
            browser.close()


def _luminance(css_color: str) -> float:
    """0 (black) to 1 (white) from a computed ``rgb(...)``/``oklch(...)`` colour (its lightness)."""
    nums = [float(x) for x in re.findall(r"[\d.]+", css_color)[:3]]
    if css_color.startswith("oklch"):
        return nums[0]
    return (0.2126 * nums[0] + 0.7152 * nums[1] + 0.0722 * nums[2]) / 255


@pytest.fixture(scope="module")
def history(redis_url: str, queue: str) -> None:
    """Two hours of history, as workers write it with their beats, so the charts have bars
    (once for the module: 24 failed runs in all)."""
    counts, now = MinuteCounts(), int(time.time() * 1000)
    for minute in range(120):
        counts.add(now - minute * 60_000, 40 + minute % 17, int(minute % 5 == 0))
    with SyncQueue(queue, redis_url=redis_url) as q:
        q.driver.pipeline(counts.take_calls(q.keys))


@pytest.mark.parametrize(("theme", "zone"), [("dark", "Asia/Kathmandu"), ("light", "America/Lima")])
def test_the_dashboard_wears_airflows_theme_and_timezone_inside_its_shell(
    af: dict[str, Any], redis_url: str, queue: str, history: None, theme: str, zone: str, tmp_path: Path
) -> None:
    """Issue 28: the colour mode and timezone chosen in Airflow's UI (its localStorage "theme" and
    "timezone" on the API server's origin) are the dashboard's, in Airflow's time format."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    playwright_sync = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM}")
    with SyncQueue(queue, redis_url=redis_url) as q:
        job = q.add("square", {"x": 5})
    with playwright_sync.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            context.add_cookies([{"name": "_token", "value": af["tokens"]["boss"], "url": af["base"]}])
            # what Airflow's UI stores when a user picks them (next-themes' "theme", the JSON "timezone")
            context.add_init_script(
                f"localStorage.setItem('theme', {json.dumps(theme)});"
                f"localStorage.setItem('timezone', {json.dumps(json.dumps(zone))});"
            )
            page = context.new_page()
            page.set_default_timeout(60_000)
            page.goto(af["base"] + f"/plugin/chasqui/chasqui/job?src=chasqui_a&queue={queue}&id={job.id}")
            frame = page.locator("iframe[title='Chasqui']").element_handle().content_frame()
            frame.locator("h2", has_text=job.id).wait_for()
            # Airflow itself is in that mode (next-themes puts the class on its <html>)...
            page.wait_for_function(f"document.documentElement.classList.contains({json.dumps(theme)})")
            # ...and so is the dashboard in its frame: attribute, and the colours really painted
            assert frame.evaluate("document.documentElement.dataset.theme") == theme
            bg = frame.evaluate("getComputedStyle(document.body).backgroundColor")
            fg = frame.evaluate("getComputedStyle(document.body).color")
            if theme == "dark":
                assert _luminance(bg) < 0.25 < _luminance(fg), (bg, fg)
            else:
                assert _luminance(bg) > 0.9 > _luminance(fg), (bg, fg)
            button = frame.evaluate("getComputedStyle(document.querySelector('form.lookup button')).borderRadius")
            assert button == "6px", button  # Airflow's buttons, not the browser's
            # the created time in the chosen zone, in Airflow's "YYYY-MM-DD HH:mm:ss" format
            frame.wait_for_function("document.documentElement.dataset.zone !== undefined")
            assert frame.evaluate("document.documentElement.dataset.zone") == zone
            shown = frame.locator("table.kv tr", has_text="created").locator("[data-ms]").inner_text()
            ms = int(frame.locator("table.kv tr", has_text="created").locator("[data-ms]").get_attribute("data-ms"))
            want = datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).strftime("%Y-%m-%d %H:%M:%S")
            assert shown.startswith(want), (shown, want)
            offset = "GMT+5:45" if zone == "Asia/Kathmandu" else "GMT-5"
            assert shown.endswith(offset), shown
            shots = Path(os.environ.get("CHASQUI_SCREENSHOT_DIR") or tmp_path)
            shots.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shots / f"dashboard-in-airflow-{theme}.png"))
            page.goto(af["base"] + f"/plugin/chasqui/chasqui/queue?src=chasqui_a&queue={queue}")
            frame = page.locator("iframe[title='Chasqui']").element_handle().content_frame()
            frame.locator("figure.history svg.chart").first.wait_for()
            # every minute of the hour has bars (the current one too, unless a minute began since the seeding)
            assert frame.locator("figure.history").nth(1).locator("rect.ok").count() in (59, 60)
            caption = frame.locator("figure.history figcaption").nth(2).inner_text()
            assert "last 7 days per hour: " in caption and " completed (up), 24 failed (down)" in caption, caption
            ticks = frame.locator("figure.history svg.chart text.x")
            texts, stamps = ticks.all_text_contents(), [int(t.get_attribute("data-ms")) for t in ticks.all()]
            fmts = ["%H:%M"] * 10 + ["%m-%d %H:%M"] * 5  # minutes on the 10-minute and hour charts, days on the week's
            want_ticks = [datetime.fromtimestamp(ms / 1000, ZoneInfo(zone)).strftime(f) for ms, f in zip(stamps, fmts)]
            assert texts == want_ticks, (texts, want_ticks)
            page.screenshot(path=str(shots / f"queue-in-airflow-{theme}.png"))
        finally:
            browser.close()
