"""The dashboard's Search page: jobs of a queue by id, name, state and a data field
(``core/search.py`` does the bounded looks; an id goes straight to the job's page)."""

from __future__ import annotations

from fastapi.responses import RedirectResponse, Response

from ..core.search import STATES, search_jobs
from ..errors import ConfigError
from .render import Ctx, h, table, when

__all__ = ["search_page"]


def search_page(c: Ctx) -> Response:
    qp = c.request.query_params
    queue = (qp.get("queue") or "").strip()
    job_id = (qp.get("id") or "").strip()
    crit = {k: (qp.get(k) or "").strip() or None for k in ("name", "state", "field", "value")}
    if queue and job_id:
        return RedirectResponse(c.url("/job", queue=queue, id=job_id).replace("&amp;", "&"), status_code=303)
    names, _ = c.source.queue_names(wait_s=0)
    body = "<h2>Search jobs</h2>" + _form(c, names, queue, job_id, crit)
    if queue and any(crit.values()):
        try:
            result = c.source.run(
                search_jobs(
                    queue,
                    group=c.source.group,
                    name=crit["name"],
                    state=crit["state"],
                    data_field=crit["field"],
                    value=crit["value"],
                )
            )
        except ConfigError as exc:
            return c.page("Search", body + f'<p class="error" role="alert">{h(exc)}</p>', "search", 400)
        rows = [
            [
                f'<a href="{c.url("/job", queue=queue, id=f.id)}">{h(f.id)}</a>',
                h(f.name),
                h(f.state),
                when(f.at_ms),
            ]
            for f in result.found
        ]
        body += f"<h3>{len(result.found)} found</h3>" + table(["job", "name", "state", "since / due"], rows, "found")
        for note in result.notes:
            body += f'<p class="note">{h(note)}</p>'
    return c.page("Search", body, "search")


def _form(c: Ctx, names: list[str], queue: str, job_id: str, crit: dict[str, str | None]) -> str:
    opts = "".join(f"<option{' selected' if n == queue else ''}>{h(n)}</option>" for n in names[:500])
    states = "".join(
        f'<option value="{s}"{" selected" if s == crit["state"] else ""}>{s or "any"}</option>' for s in ("", *STATES)
    )
    src = f'<input type="hidden" name="src" value="{h(c.label)}">' if c.label else ""

    def field(label: str, key: str, size: int = 18) -> str:
        return f'<label>{label} <input name="{key}" value="{h(crit.get(key) or "")}" size="{size}"></label>'

    return (
        f'<form method="get" action="{c.url("/search")}" class="search">{src}'
        f'<label>queue <input name="queue" list="search-queues" value="{h(queue)}" required></label>'
        f'<datalist id="search-queues">{opts}</datalist>'
        f'<label>job id <input name="id" value="{h(job_id)}" size="28"></label>'
        + field("name", "name")
        + f'<label>state <select name="state">{states}</select></label>'
        + field("data field", "field", 14)
        + field("=", "value", 14)
        + '<button type="submit">Search</button></form>'
        '<p class="note">A data field is a dotted path into the job\'s data (customer.id, items.0.sku). '
        "Each look is bounded: the oldest 2,000 entries of the stream and of the DLQ, about 2,000 delayed "
        "jobs, the newest 2,000 events; what a bound left unsearched is said below the results.</p>"
    )
