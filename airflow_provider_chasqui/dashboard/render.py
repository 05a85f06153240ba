"""The dashboard's shared rendering: escaping, times in the viewer's zone, charts, tables, and
``Ctx`` (one request: its source, links under the app's ``root_path``, forms, the page layout)."""

from __future__ import annotations

import html
import importlib.resources
import inspect
import json
import logging
import string
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from fastapi import Request
from fastapi.responses import HTMLResponse

from ..core.origin import Origin
from .auth import CsrfKey
from .data import Source, SourceSet

__all__ = [
    "PAGE",
    "Ctx",
    "chart",
    "dump",
    "h",
    "int_param",
    "iso",
    "maybe_await",
    "queue_param",
    "table",
    "when",
    "STATIC",
    "PKG",
    "LAYOUT",
]

log = logging.getLogger(__name__)

PAGE = 50
PKG = importlib.resources.files(__package__)
LAYOUT = string.Template((PKG / "templates" / "layout.html").read_text(encoding="utf-8"))
STATIC = {"dashboard.css": "text/css", "dashboard.js": "text/javascript", "theme.js": "text/javascript"}


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
        text = LAYOUT.substitute(
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


async def maybe_await(value: Any) -> Any:
    """``access``/``can_write`` may be plain functions or coroutines (Airflow's user lookup is async)."""
    return await value if inspect.isawaitable(value) else value


def queue_param(request: Request) -> str | None:
    return request.query_params.get("queue") or None


def int_param(value: Any, default: int, lo: int, hi: int) -> int:
    try:
        return max(lo, min(hi, int(value)))
    except (TypeError, ValueError):
        return default


def dump(obj: Any) -> str:
    return json.dumps(obj, default=str)
