"""The dashboard's operations pages: the DLQ and its entries, the schedules, the workers."""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import Response

from ..core.codec import now_ms
from ..core.liveness import WORKER_COLUMNS, WorkerRecord, worker_row
from ..core.text import age
from .pages import attempt_text, need_queue
from .render import PAGE, Ctx, h, int_param, iso, table, when

__all__ = ["dlq_entry_page", "dlq_page", "schedules_page", "workers_page"]

log = logging.getLogger(__name__)


def dlq_page(c: Ctx) -> Response:
    queue = need_queue(c)
    qp = c.request.query_params
    reason, name = qp.get("reason") or None, qp.get("name") or None
    cursor = qp.get("cursor") or None
    page = c.source.dlq_page(queue, cursor, int_param(qp.get("count"), PAGE, 1, 500), reason, name)
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


def dlq_entry_page(c: Ctx) -> Response:
    queue = need_queue(c)
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
        ["attempt", attempt_text(p.get("attempt"), "failed")],
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


def schedules_page(c: Ctx) -> Response:
    queue = need_queue(c)
    qp = c.request.query_params
    prefix = qp.get("prefix") or ""
    cursor = qp.get("cursor") or None
    count = int_param(qp.get("count"), PAGE, 1, 500)
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


def workers_page(c: Ctx) -> Response:
    queue = need_queue(c)
    w = c.source.workers(queue)
    body = f"<h2>Workers of {h(queue)}</h2>"
    locks = [
        [name, h(w[name]["holder"]), h(age(w[name]["ttl_ms"]) if w[name]["ttl_ms"] > 0 else "-")]
        for name in ("promoter", "scheduler")
    ]
    body += "<h3>Locks</h3>" + table(["lock", "held by", "expires in"], locks, "locks")
    now = now_ms()
    fleet = [[h(cell) for cell in worker_row(WorkerRecord(**x), now)] for x in w["workers"]]
    heads = list(WORKER_COLUMNS)
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
