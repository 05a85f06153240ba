"""The dashboard against hostile browsers and requests, without a browser: a real ``chasqui
dashboard`` on loopback with no auth (the default a DNS-rebinding page targets), the shared Redis,
and raw HTTP requests carrying the headers such pages make browsers send (issue 26, item 4) or
hostile query values.

The replays: a page whose name rebinds to 127.0.0.1 reads the form's check value and purges the
DLQ (its requests carry ``Host: evil.example``); a page on another site posts the purge form
(``Origin: http://evil.example``); a page frames the dashboard (the response's framing headers).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_support import running, wait_until
from servers import free_port

from airflow_provider_chasqui import Queue, UnrecoverableError, Worker
from airflow_provider_chasqui.core.calls import command
from airflow_provider_chasqui.dashboard.auth import CsrfKey
from airflow_provider_chasqui.sync.queue import SyncQueue

pytest.importorskip("fastapi", reason="the dashboard extra (fastapi, uvicorn) is not installed")
pytest.importorskip("uvicorn", reason="the dashboard extra (fastapi, uvicorn) is not installed")
pytestmark = [pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
EVIL = "evil.example"


def _request(
    url: str, *, host: str | None = None, data: dict[str, Any] | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """(status, headers, body); ``host`` replaces the Host header, as a rebinding page's request has it."""
    body = urllib.parse.urlencode(data, doseq=True).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, method="POST" if data is not None else "GET")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    if host is not None:
        req.add_unredirected_header("Host", host)
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=30) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read().decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


@pytest.fixture(scope="module")
def dashboard(shared_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    port = free_port()
    log = tmp_path_factory.mktemp("origin") / "dashboard.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_provider_chasqui.cli", "dashboard", "--port", str(port)]
            + ["--redis-url", shared_redis_url, "--allowed-host", "dash.internal"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=str(ROOT),
        )
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if _request(url + "/static/dashboard.css")[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < end, "the dashboard did not answer in 60 s:\n" + log.read_text()
            time.sleep(0.1)
        yield {"url": url, "port": port, "log": log}
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(20)


def _dead_letter(url: str, queue: str, n: int) -> None:
    """``n`` jobs of ``queue`` in its DLQ, through a real worker."""

    def refuse(job: Any) -> None:
        raise UnrecoverableError("refused")  # dead-lettered at once; the test's log shows it once per job

    async def run() -> None:
        q = Queue(queue, redis_url=url)
        w = Worker(queue, refuse, redis_url=url, run_scheduler=False, read_block_ms=200)
        try:
            await q.add_bulk([{"name": "bad", "data": i} for i in range(n)])
            async with running(w):
                await wait_until(lambda: _dlq_has(q, n), 60, what=f"{n} jobs in the DLQ")
        finally:
            await q.close()

    asyncio.run(run())


async def _dlq_has(q: Queue, n: int) -> bool:
    return len(await q.peek_dlq(100)) >= n


def _dlq_len(url: str, queue: str) -> int:
    with SyncQueue(queue, redis_url=url) as q:
        return int(q.driver.call(command("XLEN", q.keys.dlq)))


def _check_value(page: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
    assert m, page[:2000]
    return m.group(1)


def test_a_rebinding_page_can_neither_read_nor_purge(
    dashboard: dict[str, Any], shared_redis_url: str, queue_name: str
) -> None:
    _dead_letter(shared_redis_url, queue_name, 5)
    url, port = dashboard["url"], dashboard["port"]
    # the rebinding page's own origin: evil.example:<port>, resolved to 127.0.0.1
    status, _, body = _request(f"{url}/dlq?queue={queue_name}", host=f"{EVIL}:{port}")
    assert status == 400 and "evil.example" in body
    # even holding a valid check value (read some other way), its purge is refused
    _, _, page = _request(f"{url}/dlq?queue={queue_name}")
    form = {"queue": queue_name, "action": "purge", "confirmed": "1", "csrf": _check_value(page)}
    origin = f"http://{EVIL}:{port}"
    status, _, _ = _request(f"{url}/dlq/action", host=f"{EVIL}:{port}", data=form, headers={"Origin": origin})
    assert status == 400
    assert _dlq_len(shared_redis_url, queue_name) == 5
    # names the operator allowed, and every loopback spelling, are served
    for host in ("dash.internal", f"dash.internal:{port}", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert _request(f"{url}/dlq?queue={queue_name}", host=host)[0] == 200, host


def test_a_cross_site_post_is_refused_and_a_same_origin_one_works(
    dashboard: dict[str, Any], shared_redis_url: str, queue_name: str
) -> None:
    _dead_letter(shared_redis_url, queue_name, 3)
    url, port = dashboard["url"], dashboard["port"]
    _, _, page = _request(f"{url}/dlq?queue={queue_name}")
    form = {"queue": queue_name, "action": "purge", "confirmed": "1", "csrf": _check_value(page)}
    for headers in (
        {"Origin": f"http://{EVIL}"},
        {"Origin": "null"},  # a sandboxed frame or a data: page
        {"Origin": f"http://127.0.0.1:{port + 1}"},  # another local service's page
        {"Sec-Fetch-Site": "cross-site"},
    ):
        status, _, body = _request(f"{url}/dlq/action", data=form, headers=headers)
        assert status == 403, (headers, body)
        assert _dlq_len(shared_redis_url, queue_name) == 3, headers
    status, resp_headers, _ = _request(f"{url}/dlq/action", data=form, headers={"Origin": url})
    assert status == 303, resp_headers
    assert _dlq_len(shared_redis_url, queue_name) == 0  # the dashboard's own form still works


def test_no_page_may_be_framed(dashboard: dict[str, Any]) -> None:
    for path in ("/", "/dlq", "/static/dashboard.css"):
        status, headers, _ = _request(dashboard["url"] + path)
        assert status == 200
        assert headers["x-frame-options"] == "DENY"
        assert headers["content-security-policy"] == "frame-ancestors 'none'"
    status, headers, _ = _request(dashboard["url"] + "/", host=EVIL)  # refusals say it too
    assert status == 400 and headers["x-frame-options"] == "DENY"


def test_the_check_value_is_shared_by_processes_that_share_the_secret() -> None:
    """What the Airflow plugin relies on with several API server workers (each its own process)."""
    code = (
        "import sys; from airflow_provider_chasqui.dashboard.auth import CsrfKey; "
        "print(CsrfKey(sys.argv[1]).token('ann'))"
    )
    tokens = {
        subprocess.run(
            [sys.executable, "-c", code, "s3cret"], capture_output=True, text=True, check=True
        ).stdout.strip()
        for _ in range(2)
    }
    assert len(tokens) == 1 and tokens == {CsrfKey("s3cret").token("ann")}
    assert CsrfKey("other").token("ann") != CsrfKey("s3cret").token("ann")
    assert CsrfKey("s3cret").token("bob") != CsrfKey("s3cret").token("ann")
    assert CsrfKey().token("ann") != CsrfKey().token("ann")  # no secret: per process
    with pytest.raises(ValueError, match="empty"):
        CsrfKey("")


HOSTILE_VALUES = [
    "", "-1", "0", "1e309", "nan", "99999999999999999999999", "%ff", "%00", "%ED%A0%80", "a" * 5000,
    "0-0", "18446744073709551615-18446744073709551615", "99999999999999999999999-0", "-", "+", "(", "1-", "%e2%80%ae",
]  # fmt: skip
PARAMS = ["queue", "id", "cursor", "count", "reason", "name", "prefix", "src", "msg", "group"]
ROUTES = ["/", "/api/queues", "/queue", "/job", "/search", "/dlq", "/dlq/entry", "/schedules", "/workers"]


def test_hostile_query_values_get_a_page_or_a_400_never_a_server_error(
    dashboard: dict[str, Any], shared_redis_url: str, queue_name: str
) -> None:
    """Every page, every parameter a page reads, values Redis or Python refuse: a bad DLQ
    cursor or entry id was a 502 carrying Redis' "Invalid stream ID" (the read model now
    refuses it by name), and nothing a read sends may change the DLQ."""
    _dead_letter(shared_redis_url, queue_name, 3)
    url = dashboard["url"]
    failures = []
    for route in ROUTES:
        for param in PARAMS:
            for value in HOSTILE_VALUES:
                raw = value if value.startswith("%") else urllib.parse.quote(value)
                status, _, body = _request(f"{url}{route}?queue={queue_name}&{param}={raw}")
                if status not in (200, 303, 400, 404):  # 303: a search for an id goes to its job
                    failures.append((route, param, value[:30], status, body[:200]))
    assert not failures, failures[:10]
    for path, what in (
        ("/dlq?cursor=x", "a DLQ page cursor must look like 1700000000000-0"),
        ("/dlq?cursor=99999999999999999999999-0", "a DLQ page cursor must look like 1700000000000-0"),
        ("/dlq/entry?id=", "a DLQ entry id must look like 1700000000000-0"),
        ("/dlq/entry?id=1-", "a DLQ entry id must look like 1700000000000-0"),
    ):
        status, _, body = _request(f"{url}{path}&queue={queue_name}")
        assert status == 400 and what in body, (path, status, body[:500])
    _, _, page = _request(f"{url}/dlq?queue={queue_name}")
    form = {"queue": queue_name, "action": "replay", "confirmed": "1", "csrf": _check_value(page), "ids": ["x", "1-0"]}
    status, _, body = _request(f"{url}/dlq/action", data=form, headers={"Origin": url})
    assert status == 400 and "DLQ ids look like 1700000000000-0; got [&#x27;x&#x27;]" in body, body[:500]
    assert _dlq_len(shared_redis_url, queue_name) == 3
