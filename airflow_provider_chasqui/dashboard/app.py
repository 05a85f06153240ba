"""The dashboard's FastAPI app: server-rendered pages, one small script and stylesheet
shipped in the package (nothing loaded from the internet: pods are often offline).

``create_app(sources, access=...)`` serves the same pages standalone (``chasqui dashboard``)
and inside Airflow's API server (``plugin.py``), where it is mounted under a prefix: every
link is built from the request's ``root_path``.  Reads run in the thread pool (the engine's
blocking API); every change goes through a confirmation page and leaves an audit log line.
"""

from __future__ import annotations

import contextlib
import html
import importlib.resources
import inspect
import json
import logging
import string
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, urlencode
from zoneinfo import ZoneInfo

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from ..core.codec import now_ms
from ..core.history import HOUR_MS, MINUTE_MS
from ..core.origin import Origin
from ..errors import ChasquiError, ConfigError
from .auth import TOKEN_COOKIE, CsrfKey, open_access
from .data import EVENT_WINDOW, OVERVIEW_EVENT_WINDOW, Source, SourceSet, StaticSources, audit, pretty
from .origin import OriginGuard

__all__ = ["create_app"]

log = logging.getLogger(__name__)
PAGE = 50
_PKG = importlib.resources.files(__package__)
_LAYOUT = string.Template((_PKG / "templates" / "layout.html").read_text(encoding="utf-8"))
_STATIC = {"dashboard.css": "text/css", "dashboard.js": "text/javascript", "theme.js": "text/javascript"}


def h(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def iso(ms: int | None, tz: str | None = None) -> str:
    if ms is None or isinstance(ms, str):
        return "-" if ms is None else str(ms)
    try:
        zone = ZoneInfo(tz) if tz else UTC
        return datetime.fromtimestamp(ms / 1000, tz=zone).strftime("%Y-%m-%d %H:%M:%S %Z")
    except (ValueError, OverflowError, OSError, KeyError):
        return f"{ms} (no date)"


def when(ms: int | None) -> str:
    """UTC on the server; the script rewrites it in the viewer's zone."""
    if ms is None or isinstance(ms, str):
        return h(ms if ms is not None else "-")
    return f'<time data-ms="{int(ms)}">{h(iso(ms))}</time>'


def age(ms: int | None) -> str:
    if ms is None:
        return "-"
    s = ms / 1000
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.1f} h"


def _tick(ms: int, step_ms: int) -> str:
    """An axis label: UTC on the server, rewritten by the script in Airflow's zone."""
    fmt = "hm" if step_ms < 3_600_000 else "dhm"
    text = datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M" if fmt == "hm" else "%m-%d %H:%M")
    return f'data-ms="{int(ms)}" data-fmt="{fmt}">{h(text)}'


def chart(
    completed: list[int],
    failed: list[int],
    start_ms: int,
    step_ms: int,
    width: int = 600,
    height: int = 120,
    axes: bool = True,
) -> str:
    """Bars per bucket as inline SVG: completed above the zero line, failed below it, on one
    scale; with ``axes``, the scale's top on the y axis and five times on the x axis (each bar
    also says its time and counts when hovered)."""
    top = max(completed + failed + [1])
    n = max(1, len(completed))
    left, bottom, pad = (34, 16, 6) if axes else (0, 0, 0)
    plot_w, plot_h = width - left - 2, height - bottom - 2 * pad
    half = pad + plot_h / 2
    bw = plot_w / n
    out = []
    for i, (c, f) in enumerate(zip(completed, failed)):
        x = left + i * bw
        ch, fh = c / top * (plot_h / 2), f / top * (plot_h / 2)
        at = datetime.fromtimestamp((start_ms + i * step_ms) / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")
        tip = f"<title>{h(at)}: {c} completed, {f} failed</title>"
        w = max(bw - 1, 0.5)
        if c:
            y = half - ch
            out.append(f'<rect class="ok" x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{ch:.1f}">{tip}</rect>')
        if f:
            out.append(f'<rect class="bad" x="{x:.1f}" y="{half:.1f}" width="{w:.1f}" height="{fh:.1f}">{tip}</rect>')
    out.append(f'<line class="zero" x1="{left}" x2="{left + plot_w:.1f}" y1="{half:.1f}" y2="{half:.1f}"/>')
    if axes:
        out.append(f'<line x1="{left}" x2="{left}" y1="{pad}" y2="{pad + plot_h:.1f}"/>')
        for y, value in ((pad + 4, top), (half + 3, 0), (pad + plot_h, top)):
            out.append(f'<text class="y" x="{left - 4}" y="{y:.1f}" text-anchor="end">{value}</text>')
        for j in range(5):
            i = round(j * (n - 1) / 4) if n > 1 else 0
            x = left + i * bw + bw / 2
            anchor = "start" if j == 0 else "end" if j == 4 else "middle"
            out.append(
                f'<text class="x" x="{x:.1f}" y="{height - 3}" text-anchor="{anchor}" '
                + _tick(start_ms + i * step_ms, step_ms)
                + "</text>"
            )
    label = f"{sum(completed)} completed and {sum(failed)} failed, at most {top} per bar"
    return (
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{h(label)}">{"".join(out)}</svg>'
    )


def table(headers: list[str], rows: list[list[str]], cls: str = "") -> str:
    head = "".join(f"<th>{h(x)}</th>" for x in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    if not rows:
        body = f'<tr><td colspan="{len(headers)}" class="empty">nothing here</td></tr>'
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


class Ctx:
    """One request's view: where links point, which source, who is looking."""

    def __init__(
        self, request: Request, sources: SourceSet, user: str, title: str, can_write: bool, csrf: CsrfKey
    ) -> None:
        self.request = request
        self.csrf = csrf
        self.base = request.scope.get("root_path", "").rstrip("/")
        self.sources = sources
        self.label = request.query_params.get("src") or ""
        self.user = user
        self.title = title
        self.can_write = can_write
        self.airflow_ui: str | None = None  # see create_app

    @property
    def source(self) -> Source:
        return self.sources.get(self.label or None)

    def url(self, path: str, **params: Any) -> str:
        q = {k: v for k, v in params.items() if v not in (None, "")}
        if self.label and "src" not in q:
            q["src"] = self.label
        return h(self.base + path + ("?" + urlencode(q, doseq=True) if q else ""))

    def origin(self, origin: Origin | None) -> str:
        """The DAG run and task that made a job or spec: a link into Airflow's UI (the whole
        window, not this frame) when the app lives beside it."""
        if origin is None:
            return "-"
        text = f"{origin.dag_id} / {origin.run_id} / {origin.task_id}" + (
            f" [{origin.map_index}]" if origin.map_index >= 0 else ""
        )
        if self.airflow_ui is None:
            return h(text)
        return f'<a class="origin" href="{h(self.airflow_ui + origin.ui_path())}" target="_top">{h(text)}</a>'

    def form(self, path: str, fields: Mapping[str, Any], button: str, cls: str = "") -> str:
        hidden = "".join(
            f'<input type="hidden" name="{h(k)}" value="{h(v)}">' for k, v in fields.items() if v is not None
        )
        return (
            f'<form method="post" action="{self.url(path)}" class="inline {cls}">{hidden}'
            f'<input type="hidden" name="csrf" value="{self.csrf.token(self.user)}">'
            f'<button type="submit">{h(button)}</button></form>'
        )

    def page(self, title: str, body: str, active: str, status: int = 200) -> HTMLResponse:
        nav = "".join(
            f'<a href="{self.url(path, queue=self.request.query_params.get("queue"))}"'
            f"{' class=active' if key == active else ''}>{label}</a>"
            for key, path, label in (
                ("queues", "/", "Queues"),
                ("job", "/job", "Job"),
                ("search", "/search", "Search"),
                ("dlq", "/dlq", "DLQ"),
                ("schedules", "/schedules", "Schedules"),
                ("workers", "/workers", "Workers"),
            )
        )
        labels = self.sources.labels()
        picker = ""
        if len(labels) > 1:
            opts = "".join(
                f'<option value="{h(x)}"{" selected" if x == (self.label or labels[0]) else ""}>{h(x)}</option>'
                for x in labels
            )
            picker = (
                f'<form method="get" action="{self.url("/")}" class="picker"><label>Redis '
                f'<select name="src" onchange="this.form.submit()">{opts}</select></label></form>'
            )
        msg = self.request.query_params.get("msg")
        flash = f'<p class="flash" role="status">{h(msg)}</p>' if msg else ""
        text = _LAYOUT.substitute(
            title=h(f"{title} - {self.title}"),
            heading=h(self.title),
            nav=nav,
            picker=picker,
            user=h(self.user),
            static=h(self.base + "/static"),
            body=flash + body,
            mode="editor" if self.can_write else "viewer",
        )
        return HTMLResponse(text, status_code=status)


async def _maybe(value: Any) -> Any:
    """``access``/``can_write`` may be plain functions or coroutines (Airflow's user lookup is async)."""
    return await value if inspect.isawaitable(value) else value


def _queue_param(request: Request) -> str | None:
    return request.query_params.get("queue") or None


def _int(value: Any, default: int, lo: int, hi: int) -> int:
    try:
        return max(lo, min(hi, int(value)))
    except (TypeError, ValueError):
        return default


def create_app(  # noqa: C901, PLR0915 - the route table: one small closure per route
    sources: SourceSet | Mapping[str, str] | str,
    *,
    access: Callable[[Request, bool], Any] = open_access,
    can_write: Callable[[Request], Any] | None = None,
    title: str = "Chasqui",
    login_token: bool = False,
    csrf_secret: bytes | str | None = None,
    allowed_hosts: Collection[str] | None = None,
    frame_ancestors: str = "none",
    airflow_ui: str | None = None,
) -> FastAPI:
    """The dashboard over ``sources`` (a Redis URL, ``{label: url}``, or a ``SourceSet``).

    ``access(request, write)`` (a function or a coroutine function) returns the user's name or
    raises HTTPException: it guards every page (``write=False``) and every change
    (``write=True``).  ``can_write(request)`` only decides whether buttons are shown (default:
    whether ``access`` lets the request write).  ``login_token`` adds ``/login`` (a form that stores
    the token in a cookie).

    ``csrf_secret`` keys the forms' check value (see ``CsrfKey``; shared by every process that
    serves the app), ``allowed_hosts`` the ``Host`` names served (None: any; the loopback server
    passes its loopback names, against DNS rebinding), ``frame_ancestors`` who may frame the pages
    (``"none"``, or ``"self"`` inside Airflow's UI); cross-site changes are refused
    (``origin.OriginGuard``).  ``airflow_ui`` is the root of the Airflow UI beside the app (``""``:
    the same origin, as the plugin is): a job or spec links to the task that made it there; None
    names the task without a link."""
    if isinstance(sources, str):
        sources = StaticSources({"default": sources})
    elif not isinstance(sources, SourceSet):
        sources = StaticSources(dict(sources))
    srcs: SourceSet = sources

    async def _writer(request: Request) -> bool:
        try:
            await _maybe(access(request, True))
            return True
        except HTTPException:
            return False

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        srcs.close()

    app = FastAPI(title=f"{title} dashboard", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.sources = srcs
    csrf = CsrfKey(csrf_secret)
    app.add_middleware(OriginGuard, allowed_hosts=allowed_hosts, frame_ancestors=frame_ancestors)

    @app.exception_handler(ChasquiError)
    async def _chasqui_error(request: Request, exc: ChasquiError) -> Response:
        status = 400 if isinstance(exc, ConfigError) else 502
        return HTMLResponse(f"<!doctype html><title>error</title><p class=error>{h(exc)}</p>", status_code=status)

    async def ctx(request: Request, write: bool = False) -> Ctx:
        user = await _maybe(access(request, write))
        can = await _maybe(can_write(request)) if can_write is not None else await _writer(request)
        c = Ctx(request, srcs, user, title, bool(can), csrf)
        c.airflow_ui = airflow_ui
        return c

    async def view(
        request: Request, fn: Callable[[Ctx], Response], path: str = "/", active: str = "queues"
    ) -> Response:
        c = await ctx(request)

        def run() -> Response:
            try:
                return fn(c)
            except _PickQueue:
                return _picker_page(c, path, active)

        return await run_in_threadpool(run)

    # ---- static files and login ----------------------------------------------------------
    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in _STATIC:
            raise HTTPException(404)
        return Response(
            (_PKG / "static" / name).read_bytes(), media_type=_STATIC[name], headers={"Cache-Control": "max-age=300"}
        )

    if login_token:

        @app.get("/login")
        def login_form(request: Request) -> Response:
            base = request.scope.get("root_path", "").rstrip("/")
            body = (
                f'<form method="post" action="{h(base)}/login" class="login"><label>Token '
                '<input type="password" name="token" autofocus></label><button>Log in</button></form>'
            )
            return HTMLResponse(
                _LAYOUT.substitute(
                    title="Log in",
                    heading=h(title),
                    nav="",
                    picker="",
                    user="",
                    static=h(base + "/static"),
                    body=body,
                    mode="viewer",
                )
            )

        @app.post("/login")
        async def login(request: Request) -> Response:
            form = parse_qs((await request.body()).decode("utf-8", "replace"))
            token = (form.get("token") or [""])[0]
            base = request.scope.get("root_path", "").rstrip("/")
            resp = RedirectResponse(base + "/", status_code=303)
            resp.set_cookie(TOKEN_COOKIE, token, httponly=True, samesite="strict")
            return resp

    # ---- Queues --------------------------------------------------------------------------
    @app.get("/")
    async def queues(request: Request) -> Response:
        return await view(request, _queues_page)

    @app.get("/api/queues")
    async def queues_json(request: Request) -> Response:
        c = await ctx(request)

        def run() -> Response:
            names, state = c.source.queue_names()
            rows = [c.source.queue_row(n, event_window=OVERVIEW_EVENT_WINDOW).to_dict() for n in names[:PAGE]]
            return JSONResponse({"queues": rows, "scan": state})

        return await run_in_threadpool(run)

    @app.get("/queue")
    async def queue_detail(request: Request) -> Response:
        return await view(request, _queue_page, "/queue", "queues")

    @app.get("/job")
    async def job(request: Request) -> Response:
        return await view(request, _job_page)

    @app.get("/search")
    async def search(request: Request) -> Response:
        from .search import search_page  # the page module builds on this one's helpers

        return await view(request, search_page, "/search", "search")

    @app.get("/dlq")
    async def dlq(request: Request) -> Response:
        return await view(request, _dlq_page, "/dlq", "dlq")

    @app.get("/dlq/entry")
    async def dlq_entry(request: Request) -> Response:
        return await view(request, _dlq_entry_page, "/dlq", "dlq")

    @app.get("/schedules")
    async def schedules(request: Request) -> Response:
        return await view(request, _schedules_page, "/schedules", "schedules")

    @app.get("/workers")
    async def workers(request: Request) -> Response:
        return await view(request, _workers_page, "/workers", "workers")

    @app.post("/dlq/action")
    async def dlq_action(request: Request) -> Response:
        return await _action(request, _dlq_do)

    @app.post("/schedules/action")
    async def schedules_action(request: Request) -> Response:
        return await _action(request, _spec_do)

    @app.post("/queue/action")
    async def queue_action(request: Request) -> Response:
        return await _action(request, _queue_do)

    async def _action(request: Request, do: Callable[[Ctx, dict[str, list[str]]], tuple[str, str, str]]) -> Response:
        c = await ctx(request, write=True)
        form = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
        c.csrf.check(c.user, _first(form, "csrf"))
        if (form.get("confirmed") or [""])[0] != "1":
            return await run_in_threadpool(_confirm_page, c, form, do)
        message, back_path, queue = await run_in_threadpool(do, c, form)
        keep = (
            ("src", c.label),
            ("queue", queue),
            ("reason", _first(form, "reason")),
            ("name", _first(form, "name")),
            ("prefix", _first(form, "prefix")),
            ("id", _first(form, "id")),
            ("msg", message),
        )  # back to the page as it was filtered
        return RedirectResponse(c.base + back_path + "?" + urlencode({k: v for k, v in keep if v}), status_code=303)

    return app


# ---- pages ----------------------------------------------------------------------------------
def _queues_page(c: Ctx) -> Response:
    names, state = c.source.queue_names()
    start = _int(c.request.query_params.get("offset"), 0, 0, 10**9)
    shown = names[start : start + PAGE]
    rows = []
    for name in shown:
        r = c.source.queue_row(name, event_window=OVERVIEW_EVENT_WINDOW)
        s = r.snap
        rows.append(
            [
                f'<a href="{c.url("/queue", queue=name)}">{h(name)}</a>',
                h(s.stream),
                h(r.waiting),
                h(s.pending),
                h(s.delayed),
                f'<a href="{c.url("/dlq", queue=name)}">{h(s.dlq)}</a>',
                h(age(r.oldest_waiting_age_ms)),
                h(r.completed[-1]),
                h(r.failed[-1]),
                h(s.live_consumers),
                _limits(s),
                f'<a href="{c.url("/schedules", queue=name)}">{h(s.specs)}+{h(s.paused_specs)}</a>',
                chart(r.completed, r.failed, r.start_ms, 60_000, 160, 36, axes=False),
            ]
        )
    scan = (
        "scanning for queues..."
        if state["scanning"]
        else ("queues found by a cursor SCAN of {chasqui:*} keys (refreshed every 30 s)")
    )
    if state["error"]:
        scan += f"; last scan failed: {state['error']}"
    more = ""
    if start + PAGE < len(names):
        more = f'<p><a href="{c.url("/", offset=start + PAGE)}">next {PAGE} queues</a></p>'
    body = (
        f"<h2>Queues <small>{h(c.source.label)}: {h(c.source.shown_url)}</small></h2>"
        f'<p class="note" id="scan-state">{h(scan)}; {len(names)} queue(s)</p>'
        '<label class="live"><input type="checkbox" id="live" checked> live (every 5 s)</label>'
        '<div data-live="queues">'
        + table(
            [
                "queue",
                "stream",
                "waiting",
                "pending",
                "delayed",
                "DLQ",
                "oldest waiting",
                "done/min",
                "failed/min",
                "consumers",
                "limits",
                "specs",
                "last 10 min",
            ],
            rows,
            "queues",
        )
        + "</div>"
        + more
        + _job_form(c, names)
    )
    return c.page("Queues", body, "queues")


def _limits(s: Any) -> str:
    """The flow controls every worker obeys (issue 24), in a word each: paused, rate, slots, groups."""
    parts = ['<b class="paused">paused</b>'] if s.paused else []
    if s.rate_limit is not None:
        parts.append(h(f"{s.rate_limit.max_jobs} per {s.rate_limit.per_ms} ms"))
    if s.concurrency is not None:
        parts.append(h(f"{s.slots_held}/{s.concurrency} running"))
    if s.job_groups:
        parts.append(h(f"{s.job_groups} groups waiting"))
    return "<br>".join(parts) or '<span class="note">none</span>'


def _job_form(c: Ctx, names: list[str], queue: str | None = None, job_id: str | None = None) -> str:
    opts = "".join(f"<option{' selected' if n == queue else ''}>{h(n)}</option>" for n in names[:500])
    src = f'<input type="hidden" name="src" value="{h(c.label)}">' if c.label else ""
    return (
        f'<form method="get" action="{c.url("/job")}" class="lookup">{src}<h3>Find a job</h3>'
        f'<label>queue <input name="queue" list="queue-names" value="{h(queue or "")}" required></label>'
        f'<datalist id="queue-names">{opts}</datalist>'
        f'<label>job id <input name="id" value="{h(job_id or "")}" size="30" required></label>'
        '<button type="submit">Show</button></form>'
    )


class _PickQueue(Exception):
    """No ``?queue=``: the page shows the queues to choose from instead."""


def _need_queue(c: Ctx) -> str:
    queue = _queue_param(c.request)
    if not queue:
        raise _PickQueue()
    return queue


def _picker_page(c: Ctx, path: str, active: str) -> Response:
    names, _ = c.source.queue_names()
    links = "".join(f'<li><a href="{c.url(path, queue=n)}">{h(n)}</a></li>' for n in names[:500])
    return c.page(
        "Pick a queue", f'<h2>Pick a queue</h2><ul class="pick">{links or "<li>no queue found</li>"}</ul>', active
    )


def _queue_page(c: Ctx) -> Response:
    queue = _need_queue(c)
    r = c.source.queue_row(queue)
    s = r.snap
    state = "paused: no worker starts its jobs" if s.paused else "running"
    if c.can_write:
        verb = "resume" if s.paused else "pause"
        state = h(state) + " " + c.form("/queue/action", {"queue": queue, "action": verb}, f"{verb.title()} queue")
    rate = "none" if s.rate_limit is None else f"{s.rate_limit.max_jobs} jobs per {s.rate_limit.per_ms} ms"
    stats = [
        ["state", state],
        ["rate limit", h(rate)],
        ["concurrency", h("none" if s.concurrency is None else f"{s.slots_held} of {s.concurrency} slots held")],
        ["stream entries", h(s.stream)],
        ["waiting (not yet delivered)", h(r.waiting)],
        ["prioritized (added with a priority, not in the stream yet)", h(s.prioritized)],
        [
            "job groups with waiting jobs (next in turn: waiting, running)",
            h(s.job_groups) + "".join(f"<br>{h(g)}: {h(w)} waiting, {h(r)} running" for g, w, r in s.job_group_rows),
        ],
        ["pending (delivered, not acked)", h(s.pending)],
        ["delayed", h(s.delayed)],
        ["oldest delayed lag", h(age(s.oldest_delayed_lag_ms))],
        ["oldest waiting job", h(age(r.oldest_waiting_age_ms))],
        ["DLQ", f'<a href="{c.url("/dlq", queue=queue)}">{h(s.dlq)}</a>'],
        [
            "repeatable specs",
            f'<a href="{c.url("/schedules", queue=queue)}">{h(s.specs)} active, {h(s.paused_specs)} paused</a>',
        ],
        ["consumers", f'<a href="{c.url("/workers", queue=queue)}">{h(s.live_consumers)}</a>'],
        ["promoter lock", h(s.promoter_leader)],
        ["scheduler lock", h(s.scheduler_leader)],
        ["completed (last 10 min)", h(sum(r.completed))],
        ["failed (last 10 min)", h(sum(r.failed))],
    ]
    note = f" (the newest {EVENT_WINDOW} events only)" if r.events_window_full else ""
    hour = c.source.history(queue, HOUR_MS, MINUTE_MS)
    week = c.source.history(queue, 7 * 24 * HOUR_MS, HOUR_MS)
    figures = (
        (chart(r.completed, r.failed, r.start_ms, MINUTE_MS, 420), f"last 10 minutes per minute, from events{note}"),
        (chart(hour.completed, hour.failed, hour.start_ms, hour.step_ms, 420), "last hour per minute"),
        (chart(week.completed, week.failed, week.start_ms, week.step_ms, 640), "last 7 days per hour"),
    )
    totals = (
        (sum(r.completed), sum(r.failed)),
        (hour.total_completed, hour.total_failed),
        (week.total_completed, week.total_failed),
    )
    charts = "".join(
        f'<figure class="history">{svg}<figcaption>{h(cap)}: {done} completed (up), {bad} failed (down)'
        "</figcaption></figure>"
        for (svg, cap), (done, bad) in zip(figures, totals)
    )
    body = (
        f"<h2>Queue {h(queue)}</h2>"
        '<label class="live"><input type="checkbox" id="live" checked> live (every 5 s)</label>'
        f'<div data-live="queue"><div class="charts">{charts}</div>'
        + table(["what", "value"], stats, "kv")
        + "</div>"
        + _job_form(c, [queue], queue)
    )
    return c.page(f"Queue {queue}", body, "queues")


def _attempt_text(attempt: int | None, state: str) -> str:
    """The one attempt numbering (``core.inspect.latest_attempt``: 1-indexed, as in events)."""
    if not attempt:
        return "none yet" if state in ("waiting", "delayed") else "-"
    if state in ("waiting", "delayed"):
        return f"{attempt} failed; attempt {attempt + 1} next"
    return f"attempt {attempt}"


def _progress_bar(value: Any) -> str:
    """A number from 0 to 100 as a bar (a percentage); anything else as its JSON."""
    if isinstance(value, (int, float)) and 0 <= value <= 100:
        return f'<progress class="job-progress" max="100" value="{h(value)}"></progress> {h(value)}%'
    return f'<code class="job-progress">{h(dump(value))}</code>'


def _cancel_button(c: Ctx, queue: str, job_id: str, state: str) -> str:
    """``Queue.cancel`` for a job that has not ended (confirmed and audited like every change)."""
    if not c.can_write or state in ("completed", "failed", "cancelled"):
        return ""
    return " " + c.form("/queue/action", {"queue": queue, "action": "cancel_job", "id": job_id}, "Cancel job")


def _job_page(c: Ctx) -> Response:
    queue = _queue_param(c.request)
    job_id = (c.request.query_params.get("id") or "").strip()
    names, _ = c.source.queue_names(wait_s=0)
    if not queue or not job_id:
        return c.page("Job", "<h2>Job</h2>" + _job_form(c, names, queue, job_id), "job")
    j = c.source.job(queue, job_id)
    if j is None:
        body = (
            f'<h2>Job {h(job_id)}</h2><p class="note">No trace of this job on {h(queue)}: a wrong id or '
            "queue, or its records expired.</p>"
        )
        return c.page(f"Job {job_id}", body + _job_form(c, names, queue, job_id), "job")
    rows = [
        ["queue", f'<a href="{c.url("/queue", queue=queue)}">{h(queue)}</a>'],
        ["id", f"<code>{h(job_id)}</code>"],
        ["state", f'<b class="state">{h(j.state)}</b>' + _cancel_button(c, queue, job_id, j.state)],
        ["name", h(j.name)],
        ["created", when(j.created_at_ms)],
        ["attempt", _attempt_text(j.attempt, j.state)],
    ]
    if j.origin is not None:
        rows.append(["enqueued by (DAG / run / task)", c.origin(j.origin)])
    if j.entry_id:
        rows.append(["stream entry", h(j.entry_id) + (f" held by {h(j.consumer)}" if j.consumer else "")])
    if j.run_at_ms is not None:
        rows.append(["due", when(j.run_at_ms)])
    if j.progress is not None:
        rows.append(["progress", _progress_bar(j.progress)])
    if j.dlq:
        dlq_id = j.dlq.get("dlq_id")
        rows.append(
            [
                "DLQ entry",
                f'<a href="{c.url("/dlq/entry", queue=queue, id=dlq_id)}">{h(dlq_id)}</a>'
                f" reason {h(j.dlq.get('reason'))}",
            ]
        )
    if j.failure:
        f = j.failure
        rows.append(["failure", f'{h(f.get("reason"))}: <pre class="inline">{h(f.get("detail"))}</pre>'])
    body = f"<h2>Job {h(job_id)}</h2>" + table(["what", "value"], rows, "kv")
    tb = (j.failure or {}).get("traceback") or (j.dlq or {}).get("detail")
    if tb:
        body += f'<h3>Traceback <small>of the last failed run</small></h3><pre class="traceback">{h(tb)}</pre>'
    for note in j.notes:  # a bound stopped a search, a record did not decode (core/inspect.py)
        body += f'<p class="note">{h(note)}</p>'
    if j.data_bytes is not None:
        text, cut = pretty(j.data)
        more = ' <span class="note">(cut at 64 KiB)</span>' if cut else ""
        body += f'<h3>Data <small>{h(j.data_bytes)} bytes</small>{more}</h3><pre class="data">{h(text)}</pre>'
    if j.has_result:
        body += f'<h3>Result</h3><pre class="data result">{h(pretty(j.result)[0])}</pre>'
    events = [
        [
            when(_event_ms(e)),
            h(e.get("e")),
            h(", ".join(f"{k}={v}" for k, v in e.items() if k not in ("e", "id", "ts"))),
        ]
        for e in j.events
    ]
    body += "<h3>Events</h3>" + table(["at", "event", "fields"], events, "timeline")
    body += _job_form(c, names, queue, job_id)
    return c.page(f"Job {job_id}", body, "job")


def _event_ms(event: dict[str, Any]) -> int | None:
    ts = event.get("ts", "")
    return int(ts) if isinstance(ts, str) and ts.isdigit() else None


def _dlq_page(c: Ctx) -> Response:
    queue = _need_queue(c)
    qp = c.request.query_params
    reason, name = qp.get("reason") or None, qp.get("name") or None
    cursor = qp.get("cursor") or None
    page = c.source.dlq_page(queue, cursor, _int(qp.get("count"), PAGE, 1, 500), reason, name)
    rows = []
    for r in page["rows"]:
        box = (
            (
                f'<input type="checkbox" name="ids" value="{h(r["dlq_id"])}" form="dlq-selected" '
                f'aria-label="select {h(r["dlq_id"])}">'
            )
            if c.can_write
            else ""
        )
        job = (
            f'<a href="{c.url("/job", queue=queue, id=r["job_id"])}">{h(r["job_id"])}</a>'
            if r["job_id"]
            else "(undecodable)"
        )
        err = (r.get("error") or r["detail"] or "").removeprefix("handler: Python handler raised: ")
        actions = f'<a href="{c.url("/dlq/entry", queue=queue, id=r["dlq_id"])}">view</a>'
        if c.can_write:
            actions += c.form("/dlq/action", {"queue": queue, "action": "replay", "ids": r["dlq_id"]}, "replay")
            actions += c.form("/dlq/action", {"queue": queue, "action": "remove", "ids": r["dlq_id"]}, "remove")
        rows.append([box, h(r["dlq_id"]), job, h(r["name"]), h(r["reason"]), h(err[:120]), h(r["bytes"]), actions])
    src = f'<input type="hidden" name="src" value="{h(c.label)}">' if c.label else ""
    filt = (
        f'<form method="get" action="{c.url("/dlq")}" class="filter">{src}'
        f'<input type="hidden" name="queue" value="{h(queue)}">'
        f'<label>reason <input name="reason" value="{h(reason or "")}"></label>'
        f'<label>name <input name="name" value="{h(name or "")}"></label><button>Filter</button></form>'
    )
    bulk = ""
    if c.can_write:
        sel = {"queue": queue, "action": "replay"}
        bulk = (
            f'<form method="post" action="{c.url("/dlq/action")}" id="dlq-selected" class="inline">'
            f'<input type="hidden" name="csrf" value="{c.csrf.token(c.user)}">'
            f'<input type="hidden" name="queue" value="{h(queue)}">'
            '<button name="action" value="replay">replay selected</button>'
            '<button name="action" value="remove">remove selected</button></form>'
            + c.form(
                "/dlq/action",
                {"queue": queue, "action": "replay_matching", "reason": reason, "name": name},
                "replay all matching",
            )
            + c.form(
                "/dlq/action",
                {"queue": queue, "action": "purge", "reason": reason, "name": name},
                "purge all matching",
                "danger",
            )
        )
        del sel
    nxt = (
        (
            f'<a href="{c.url("/dlq", queue=queue, reason=reason, name=name, cursor=page["next"])}" '
            'class="next">next page</a>'
        )
        if page["next"]
        else ""
    )
    first = f'<a href="{c.url("/dlq", queue=queue, reason=reason, name=name)}">first page</a>' if cursor else ""
    body = (
        f'<h2>DLQ of {h(queue)} <small>{h(page["total"])} entries</small></h2>{filt}<div class="bulk">{bulk}</div>'
        + table(["", "DLQ id", "job", "name", "reason", "error / detail", "bytes", ""], rows, "dlq")
        + f'<p class="pager">{first} {nxt}</p>'
    )
    return c.page(f"DLQ {queue}", body, "dlq")


def _dlq_entry_page(c: Ctx) -> Response:
    queue = _need_queue(c)
    dlq_id = c.request.query_params.get("id") or ""
    e = c.source.dlq_entry(queue, dlq_id)
    if e is None:
        return c.page(
            "DLQ entry",
            f"<h2>DLQ entry {h(dlq_id)}</h2><p>not in the DLQ of {h(queue)} (replayed or removed?)</p>",
            "dlq",
            404,
        )
    p = e["payload"]
    rows = [
        ["DLQ id", h(e["dlq_id"])],
        [
            "job",
            f'<a href="{c.url("/job", queue=queue, id=e["job_id"])}">{h(e["job_id"])}</a>'
            if e["job_id"]
            else "(undecodable)",
        ],
        ["name", h(e["name"])],
        ["reason", h(e["reason"])],
        ["detail", f'<pre class="inline">{h(e["detail"])}</pre>'],
        ["attempt", _attempt_text(p.get("attempt"), "failed")],
        ["created", when(p.get("created_ms"))],
        ["payload bytes", h(p.get("size"))],
    ]
    if p.get("error"):
        rows.append(["decode error", h(p["error"])])
    actions = ""
    if c.can_write:
        actions = c.form("/dlq/action", {"queue": queue, "action": "replay", "ids": dlq_id}, "replay") + c.form(
            "/dlq/action", {"queue": queue, "action": "remove", "ids": dlq_id}, "remove", "danger"
        )
    body = (
        f"<h2>DLQ entry {h(dlq_id)}</h2>"
        + table(["what", "value"], rows, "kv")
        + f'<div class="bulk">{actions}</div>'
        + f'<h3>Payload</h3><pre class="data">{h(p.get("data"))}</pre>'
    )
    return c.page("DLQ entry", body, "dlq")


def _spec_tz(info: Any) -> str | None:
    p = info.pattern
    return (p.tz or "UTC") if p.kind == "cron" else None


def _schedules_page(c: Ctx) -> Response:
    queue = _need_queue(c)
    qp = c.request.query_params
    prefix = qp.get("prefix") or ""
    cursor = qp.get("cursor") or None
    count = _int(qp.get("count"), PAGE, 1, 500)
    q = c.source.queue(queue)
    if prefix:
        items, nxt = c.source.spec_search(queue, prefix, cursor, count)
    else:
        items, nxt = q.list_repeatable(cursor=cursor, count=count)
    rows = []
    origins = c.source.spec_origins(queue, [m.key for m in items if not m.corrupt])
    for m in items:
        if m.corrupt:
            rows.append([h(m.key), "-", "-", h(m.score), "-", "-", "CORRUPT: " + h(m.reason), "", "", ""])
            continue
        p = m.pattern
        pattern = p.expression if p.kind == "cron" else f"every {p.interval_ms} ms"
        tz = _spec_tz(m)
        actions = ""
        if c.can_write:
            for verb in (("resume",) if m.paused else ("pause",)) + ("trigger", "remove"):
                actions += c.form(
                    "/schedules/action",
                    {"queue": queue, "action": verb, "key": m.key, "prefix": prefix},
                    verb,
                    "danger" if verb == "remove" else "",
                )
        rows.append(
            [
                f"<code>{h(m.key)}</code>",
                h(m.job_name),
                h(pattern),
                h(tz or "-"),
                (h(iso(m.next_fire_ms, tz)) if tz else "-") + "<br>" + when(m.next_fire_ms),
                f"{h(m.fired)} / {h(m.skipped)}",
                "paused" if m.paused else "active",
                h(m.limit),
                c.origin(origins.get(m.key)),
                actions,
            ]
        )
    src = f'<input type="hidden" name="src" value="{h(c.label)}">' if c.label else ""
    search = (
        f'<form method="get" action="{c.url("/schedules")}" class="filter">{src}'
        f'<input type="hidden" name="queue" value="{h(queue)}">'
        f'<label>key prefix <input name="prefix" value="{h(prefix)}"></label><button>Search</button></form>'
    )
    nxt_link = (
        f'<a class="next" href="{c.url("/schedules", queue=queue, prefix=prefix, cursor=nxt)}">next page</a>'
        if nxt
        else ""
    )
    quarantined = c.source.quarantined(queue)
    quar = ""
    if quarantined:
        quar = "<h3>Quarantined specs</h3>" + table(
            ["key", "stored bytes"], [[f"<code>{h(k)}</code>", h(n)] for k, n in quarantined], "quarantine"
        )
    body = (
        f"<h2>Schedules of {h(queue)}</h2>{search}"
        + table(
            [
                "key",
                "job",
                "pattern",
                "zone",
                "next fire (spec zone / yours)",
                "fired / skipped",
                "state",
                "limit",
                "upserted by (DAG / run / task)",
                "",
            ],
            rows,
            "specs",
        )
        + f'<p class="pager">{nxt_link}</p>{quar}'
    )
    return c.page(f"Schedules {queue}", body, "schedules")


def _workers_page(c: Ctx) -> Response:
    queue = _need_queue(c)
    w = c.source.workers(queue)
    body = f"<h2>Workers of {h(queue)}</h2>"
    locks = [
        [name, h(w[name]["holder"]), h(age(w[name]["ttl_ms"]) if w[name]["ttl_ms"] > 0 else "-")]
        for name in ("promoter", "scheduler")
    ]
    body += "<h3>Locks</h3>" + table(["lock", "held by", "expires in"], locks, "locks")
    now = now_ms()
    fleet = [
        [
            h(x["consumer"]),
            "alive" if x["live"] else "gone (no beat for two leases)",
            h(x["host"]),
            h(x["pid"]),
            h(x["version"]),
            h(x["kind"]),
            h(", ".join(x["handlers"])),
            h(x["concurrency"]),
            h(age(now - x["started_ms"]) if x["started_ms"] else "-"),
            h(age(now - x["beat_ms"]) + " ago" if x["beat_ms"] else "-"),
            {True: "ok", False: "unhealthy", None: "-"}[x["ok"]],
        ]
        for x in w["workers"]
    ]
    heads = [
        "worker",
        "state",
        "host",
        "pid",
        "version",
        "kind",
        "handlers",
        "concurrency",
        "up",
        "last beat",
        "health",
    ]
    body += "<h3>Worker processes</h3>" + (
        table(heads, fleet, "fleet") if fleet else "<p>no worker beats on this queue (ChasquiMQ workers do not)</p>"
    )
    if not w["groups"]:
        body += "<p>no consumer group yet (no worker has read this queue)</p>"
    for g in w["groups"]:
        rows = [
            [
                h(x["name"]),
                {True: "alive", False: "gone", None: "no heartbeat"}[x.get("live")],
                h(x["pending"]),
                h(age(x["idle_ms"])),
                h(age(x["inactive_ms"])),
            ]
            for x in g["consumers"]
        ]
        body += f"<h3>Group {h(g['name'])} <small>{h(g['pending'])} pending, lag {h(g['lag'])}</small></h3>" + table(
            ["consumer", "heartbeat", "pending", "idle", "inactive"], rows, "consumers"
        )
    return c.page(f"Workers {queue}", body, "workers")


# ---- actions ----------------------------------------------------------------------------------
_DLQ_ACTIONS = {
    "replay": "Replay",
    "remove": "Remove",
    "replay_matching": "Replay every matching entry of",
    "purge": "Purge every matching entry of",
}
_SPEC_ACTIONS = {"pause": "Pause", "resume": "Resume", "trigger": "Fire once now", "remove": "Remove"}
_QUEUE_ACTIONS = {
    "pause": "Pause (no worker starts a new job until it is resumed; running jobs finish)",
    "resume": "Resume (workers start its jobs again)",
    "cancel_job": "Cancel (never retried nor dead-lettered; a running async handler is stopped)",
}


def _first(form: dict[str, list[str]], key: str) -> str | None:
    v = (form.get(key) or [""])[0]
    return v or None


def _confirm_page(c: Ctx, form: dict[str, list[str]], do: Callable[..., Any]) -> Response:
    queue = _first(form, "queue") or ""
    action = _first(form, "action") or ""
    if do is _dlq_do:
        if action not in _DLQ_ACTIONS:
            raise ConfigError(f"unknown DLQ action {action!r}")
        ids = form.get("ids") or []
        if action in ("replay", "remove"):
            if not ids:
                raise ConfigError("select at least one entry")
            what = (
                f"{_DLQ_ACTIONS[action]} {len(ids)} DLQ entr{'y' if len(ids) == 1 else 'ies'} of {queue}: "
                + ", ".join(ids[:20])
                + (" ..." if len(ids) > 20 else "")
            )
        else:
            which = " and ".join(f"{k} = {_first(form, k)!r}" for k in ("reason", "name") if _first(form, k))
            what = f"{_DLQ_ACTIONS[action]} the DLQ of {queue}" + (f" with {which}" if which else " (every entry)")
        back = c.url("/dlq", queue=queue)
    elif do is _queue_do:
        if action not in _QUEUE_ACTIONS:
            raise ConfigError(f"unknown queue action {action!r}")
        what = f"{_QUEUE_ACTIONS[action]} the queue {queue}"
        back = c.url("/queue", queue=queue)
        if action == "cancel_job":
            what = f"{_QUEUE_ACTIONS[action]} the job {_first(form, 'id')!r} of {queue}"
            back = c.url("/job", queue=queue, id=_first(form, "id"))
    else:
        if action not in _SPEC_ACTIONS:
            raise ConfigError(f"unknown schedule action {action!r}")
        what = f"{_SPEC_ACTIONS[action]} the spec {_first(form, 'key')!r} of {queue}"
        back = c.url("/schedules", queue=queue)
    hidden = "".join(
        f'<input type="hidden" name="{h(k)}" value="{h(v)}">'
        for k, vs in form.items()
        for v in vs
        if k not in ("confirmed",)
    )
    path = {_dlq_do: "/dlq/action", _queue_do: "/queue/action"}.get(do, "/schedules/action")
    body = (
        f'<h2>Confirm</h2><p class="confirm-what">{h(what)}?</p>'
        f'<form method="post" action="{c.url(path)}" class="confirm">{hidden}'
        '<input type="hidden" name="confirmed" value="1">'
        f'<button type="submit" class="danger" id="confirm">Yes, {h(action.replace("_", " "))}</button> '
        f'<a href="{back}">Cancel</a></form>'
    )
    return c.page("Confirm", body, {_dlq_do: "dlq", _queue_do: "queues"}.get(do, "schedules"))


def _dlq_do(c: Ctx, form: dict[str, list[str]]) -> tuple[str, str, str]:
    queue = _first(form, "queue") or ""
    action = _first(form, "action")
    ids = form.get("ids") or []
    reason, name = _first(form, "reason"), _first(form, "name")
    src = c.source
    if action == "replay":
        n = src.replay_ids(queue, ids)
        message = f"replayed {n} of {len(ids)} entries"
        audit(c.user, src.label, queue, "dlq.replay", ids=ids, replayed=n)
    elif action == "remove":
        n = src.queue(queue).remove_dlq(ids)
        message = f"removed {n} of {len(ids)} entries"
        audit(c.user, src.label, queue, "dlq.remove", ids=ids, removed=n)
    elif action == "replay_matching":
        report = src.replay_matching(queue, reason, name)
        message = f"replayed {report['replayed']} entries" + (
            f", skipped {report['skipped']} undecodable" if report["skipped"] else ""
        )
        audit(c.user, src.label, queue, "dlq.replay_matching", reason=reason, name=name, **report)
    elif action == "purge":
        n = src.queue(queue).purge_dlq(reason=reason, name=name)
        message = f"purged {n} entries"
        audit(c.user, src.label, queue, "dlq.purge", reason=reason, name=name, purged=n)
    else:
        raise ConfigError(f"unknown DLQ action {action!r}")
    return message, "/dlq", queue


def _spec_do(c: Ctx, form: dict[str, list[str]]) -> tuple[str, str, str]:
    queue = _first(form, "queue") or ""
    action = _first(form, "action")
    key = _first(form, "key") or ""
    q = c.source.queue(queue)
    if action == "pause":
        ok: Any = q.pause_repeatable(key)
    elif action == "resume":
        ok = q.resume_repeatable(key)
    elif action == "remove":
        ok = q.remove_repeatable_by_key(key)
    elif action == "trigger":
        job = q.trigger_repeatable(key)
        ok = job is not None
        if job is not None:
            audit(c.user, c.source.label, queue, "spec.trigger", key=key, job_id=job.id)
            return f"fired {key} now: job {job.id}", "/schedules", queue
    else:
        raise ConfigError(f"unknown schedule action {action!r}")
    audit(c.user, c.source.label, queue, f"spec.{action}", key=key, ok=bool(ok))
    done = {"pause": "paused", "resume": "resumed", "remove": "removed", "trigger": "fired"}[action]
    return (f"{done} {key}" if ok else f"no spec {key!r} to {action}"), "/schedules", queue


def _queue_do(c: Ctx, form: dict[str, list[str]]) -> tuple[str, str, str]:
    """Pause or resume a queue (``Queue.pause()``/``resume()``), or cancel one of its jobs
    (``Queue.cancel``), audited."""
    queue = _first(form, "queue") or ""
    action = _first(form, "action")
    q = c.source.queue(queue)
    if action == "cancel_job":
        job_id = _first(form, "id") or ""
        state = q.cancel(job_id)
        audit(c.user, c.source.label, queue, "job.cancel", job_id=job_id, state=state)
        return f"job {job_id}: cancel {state}", "/job", queue
    if action == "pause":
        q.pause()
    elif action == "resume":
        q.resume()
    else:
        raise ConfigError(f"unknown queue action {action!r}")
    paused = q.is_paused()
    audit(c.user, c.source.label, queue, f"queue.{action}", paused=paused)
    return f"{queue} is {'paused' if paused else 'running'}", "/queue", queue


def dump(obj: Any) -> str:
    return json.dumps(obj, default=str)
