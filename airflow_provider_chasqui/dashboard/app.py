"""The dashboard's FastAPI app: server-rendered pages, one small script and stylesheet
shipped in the package (nothing loaded from the internet: pods are often offline).

``create_app(sources, access=...)`` serves the same pages standalone (``chasqui dashboard``)
and inside Airflow's API server (``plugin.py``), where it is mounted under a prefix: every
link is built from the request's ``root_path``.  Reads run in the thread pool (the engine's
blocking API); every change goes through a confirmation page and leaves an audit log line.
This module is the route table; the pages live in ``pages.py`` (queues, a queue, a job),
``ops_pages.py`` (DLQ, schedules, workers) and ``search.py``, the changes in ``actions.py``, and
what they share (escaping, times, charts, ``Ctx``) in ``render.py``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from ..errors import ChasquiError, ConfigError
from .actions import confirm_page, dlq_do, first, queue_do, spec_do
from .auth import TOKEN_COOKIE, CsrfKey, open_access
from .data import OVERVIEW_EVENT_WINDOW, SourceSet, StaticSources
from .ops_pages import dlq_entry_page, dlq_page, schedules_page, workers_page
from .origin import OriginGuard
from .pages import PickQueue, job_page, picker_page, queue_page, queues_page
from .render import LAYOUT, PAGE, PKG, STATIC, Ctx, h, maybe_await
from .search import search_page

__all__ = ["create_app"]

log = logging.getLogger(__name__)


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
            await maybe_await(access(request, True))
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
        user = await maybe_await(access(request, write))
        can = await maybe_await(can_write(request)) if can_write is not None else await _writer(request)
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
            except PickQueue:
                return picker_page(c, path, active)

        return await run_in_threadpool(run)

    # ---- static files and login ----------------------------------------------------------
    @app.get("/static/{name}")
    def static(name: str) -> Response:
        if name not in STATIC:
            raise HTTPException(404)
        return Response(
            (PKG / "static" / name).read_bytes(), media_type=STATIC[name], headers={"Cache-Control": "max-age=300"}
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
                LAYOUT.substitute(
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
        return await view(request, queues_page)

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
        return await view(request, queue_page, "/queue", "queues")

    @app.get("/job")
    async def job(request: Request) -> Response:
        return await view(request, job_page)

    @app.get("/search")
    async def search(request: Request) -> Response:
        return await view(request, search_page, "/search", "search")

    @app.get("/dlq")
    async def dlq(request: Request) -> Response:
        return await view(request, dlq_page, "/dlq", "dlq")

    @app.get("/dlq/entry")
    async def dlq_entry(request: Request) -> Response:
        return await view(request, dlq_entry_page, "/dlq", "dlq")

    @app.get("/schedules")
    async def schedules(request: Request) -> Response:
        return await view(request, schedules_page, "/schedules", "schedules")

    @app.get("/workers")
    async def workers(request: Request) -> Response:
        return await view(request, workers_page, "/workers", "workers")

    @app.post("/dlq/action")
    async def dlq_action(request: Request) -> Response:
        return await _action(request, dlq_do)

    @app.post("/schedules/action")
    async def schedules_action(request: Request) -> Response:
        return await _action(request, spec_do)

    @app.post("/queue/action")
    async def queue_action(request: Request) -> Response:
        return await _action(request, queue_do)

    async def _action(request: Request, do: Callable[[Ctx, dict[str, list[str]]], tuple[str, str, str]]) -> Response:
        c = await ctx(request, write=True)
        form = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
        c.csrf.check(c.user, first(form, "csrf"))
        if (form.get("confirmed") or [""])[0] != "1":
            return await run_in_threadpool(confirm_page, c, form, do)
        message, back_path, queue = await run_in_threadpool(do, c, form)
        keep = (
            ("src", c.label),
            ("queue", queue),
            ("reason", first(form, "reason")),
            ("name", first(form, "name")),
            ("prefix", first(form, "prefix")),
            ("id", first(form, "id")),
            ("msg", message),
        )  # back to the page as it was filtered
        return RedirectResponse(c.base + back_path + "?" + urlencode({k: v for k, v in keep if v}), status_code=303)

    return app


# ---- pages ----------------------------------------------------------------------------------
