"""The dashboard's queue pages: the queue list, one queue (limits, history, groups), one job."""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import Response

from ..core.history import HOUR_MS, MINUTE_MS
from ..core.removal import CLEAN_STATES
from ..core.text import age
from .data import EVENT_WINDOW, OVERVIEW_EVENT_WINDOW, pretty
from .render import PAGE, Ctx, chart, dump, h, int_param, queue_param, table, when

__all__ = [
    "PickQueue",
    "attempt_text",
    "job_form",
    "job_page",
    "need_queue",
    "picker_page",
    "queue_page",
    "queues_page",
]

log = logging.getLogger(__name__)


def queues_page(c: Ctx) -> Response:
    names, state = c.source.queue_names()
    start = int_param(c.request.query_params.get("offset"), 0, 0, 10**9)
    shown = names[start : start + PAGE]
    rows = []
    for name in shown:
        r = c.source.queue_row(name, event_window=OVERVIEW_EVENT_WINDOW)
        s = r.snap
        rows.append(
            [
                f'<a href="{c.url("/queue", queue=name)}">{h(name)}</a>' + _spoiled_mark(s.spoiled),
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
        + job_form(c, names)
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


def job_form(c: Ctx, names: list[str], queue: str | None = None, job_id: str | None = None) -> str:
    opts = "".join(f"<option{' selected' if n == queue else ''}>{h(n)}</option>" for n in names[:500])
    src = f'<input type="hidden" name="src" value="{h(c.label)}">' if c.label else ""
    return (
        f'<form method="get" action="{c.url("/job")}" class="lookup">{src}<h3>Find a job</h3>'
        f'<label>queue <input name="queue" list="queue-names" value="{h(queue or "")}" required></label>'
        f'<datalist id="queue-names">{opts}</datalist>'
        f'<label>job id <input name="id" value="{h(job_id or "")}" size="30" required></label>'
        '<button type="submit">Show</button></form>'
    )


class PickQueue(Exception):
    """No ``?queue=``: the page shows the queues to choose from instead."""


def need_queue(c: Ctx) -> str:
    queue = queue_param(c.request)
    if not queue:
        raise PickQueue()
    return queue


def picker_page(c: Ctx, path: str, active: str) -> Response:
    names, _ = c.source.queue_names()
    links = "".join(f'<li><a href="{c.url(path, queue=n)}">{h(n)}</a></li>' for n in names[:500])
    return c.page(
        "Pick a queue", f'<h2>Pick a queue</h2><ul class="pick">{links or "<li>no queue found</li>"}</ul>', active
    )


def queue_page(c: Ctx) -> Response:
    queue = need_queue(c)
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
        + spoiled_notes(s.spoiled)
        + "</div>"
        + _clean_form(c, queue)
        + job_form(c, [queue], queue)
    )
    return c.page(f"Queue {queue}", body, "queues")


def _spoiled_mark(spoiled: dict[str, str]) -> str:
    return f' <span class="error" title="{h(", ".join(spoiled))}">(spoiled keys)</span>' if spoiled else ""


def spoiled_notes(spoiled: dict[str, str]) -> str:
    """The keys the read model counted as empty because they hold another type (``core/key_types.py``)."""
    return "".join(
        f'<p class="error spoiled">{h(key)} holds a {h(found)} (foreign or hostile data): counted as empty</p>'
        for key, found in spoiled.items()
    )


def attempt_text(attempt: int | None, state: str) -> str:
    """The one attempt numbering (``core.job_details.latest_attempt``: 1-indexed, as in events)."""
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


def _job_buttons(c: Ctx, queue: str, job_id: str, state: str) -> str:
    """``Queue.cancel`` for a job that has not ended, ``Queue.remove`` for one no worker runs
    (confirmed and audited like every change)."""
    if not c.can_write:
        return ""
    out = ""
    if state not in ("completed", "failed", "cancelled"):
        out += " " + c.form("/queue/action", {"queue": queue, "action": "cancel_job", "id": job_id}, "Cancel job")
    if state != "active":
        out += " " + c.form("/queue/action", {"queue": queue, "action": "remove_job", "id": job_id}, "Remove job")
    return out


def _clean_form(c: Ctx, queue: str) -> str:
    """``Queue.clean``: jobs of a state older than a grace, up to a limit (confirmed, audited)."""
    if not c.can_write:
        return ""
    states = "".join(f'<option value="{s}">{s}</option>' for s in CLEAN_STATES)
    return (
        f'<form method="post" action="{c.url("/queue/action")}" class="clean">'
        f'<input type="hidden" name="queue" value="{h(queue)}"><input type="hidden" name="action" value="clean">'
        f'<input type="hidden" name="csrf" value="{c.csrf.token(c.user)}">'
        f'<label>Clean <select name="state">{states}</select> jobs</label> '
        '<label>older than <input name="grace_ms" value="3600000" size="10" inputmode="numeric"> ms,</label> '
        '<label>at most <input name="limit" value="1000" size="8" inputmode="numeric"> (0: no limit)</label> '
        '<button type="submit">Clean</button></form>'
    )


def job_page(c: Ctx) -> Response:
    queue = queue_param(c.request)
    job_id = (c.request.query_params.get("id") or "").strip()
    names, _ = c.source.queue_names(wait_s=0)
    if not queue or not job_id:
        return c.page("Job", "<h2>Job</h2>" + job_form(c, names, queue, job_id), "job")
    j = c.source.job(queue, job_id)
    if j is None:
        body = (
            f'<h2>Job {h(job_id)}</h2><p class="note">No trace of this job on {h(queue)}: a wrong id or '
            "queue, or its records expired.</p>"
        )
        return c.page(f"Job {job_id}", body + job_form(c, names, queue, job_id), "job")
    rows = [
        ["queue", f'<a href="{c.url("/queue", queue=queue)}">{h(queue)}</a>'],
        ["id", f"<code>{h(job_id)}</code>"],
        ["state", f'<b class="state">{h(j.state)}</b>' + _job_buttons(c, queue, job_id, j.state)],
        ["name", h(j.name)],
        ["created", when(j.created_at_ms)],
        ["attempt", attempt_text(j.attempt, j.state)],
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
    if j.log_lines:
        of = f"the newest {len(j.logs)} of {j.log_lines} lines" if j.log_lines > len(j.logs) else f"{j.log_lines} lines"
        body += f'<h3>Log <small>{h(of)}</small></h3><pre class="job-log">{h(chr(10).join(j.logs))}</pre>'
    events = [
        [
            when(_event_ms(e)),
            h(e.get("e")),
            h(", ".join(f"{k}={v}" for k, v in e.items() if k not in ("e", "id", "ts"))),
        ]
        for e in j.events
    ]
    body += "<h3>Events</h3>" + table(["at", "event", "fields"], events, "timeline")
    body += job_form(c, names, queue, job_id)
    return c.page(f"Job {job_id}", body, "job")


def _event_ms(event: dict[str, Any]) -> int | None:
    ts = event.get("ts", "")
    return int(ts) if isinstance(ts, str) and ts.isdigit() else None
