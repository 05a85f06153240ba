"""The dashboard's changes: each goes through a confirmation page (CSRF-checked) and leaves an
audit log line; the DLQ, schedule and queue actions."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi.responses import Response

from ..core.removal import check_clean
from ..errors import ConfigError
from .data import audit
from .render import Ctx, h

__all__ = ["clean_args", "confirm_page", "dlq_do", "first", "queue_do", "spec_do"]

log = logging.getLogger(__name__)

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
    "remove_job": "Remove (its delayed, waiting, DLQ and stored-result places; a job a worker read stays)",
    "clean": "Clean (delete, with their records; a job a worker read stays)",
}


def first(form: dict[str, list[str]], key: str) -> str | None:
    v = (form.get(key) or [""])[0]
    return v or None


def confirm_page(c: Ctx, form: dict[str, list[str]], do: Callable[..., Any]) -> Response:
    queue = first(form, "queue") or ""
    action = first(form, "action") or ""
    if do is dlq_do:
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
            which = " and ".join(f"{k} = {first(form, k)!r}" for k in ("reason", "name") if first(form, k))
            what = f"{_DLQ_ACTIONS[action]} the DLQ of {queue}" + (f" with {which}" if which else " (every entry)")
        back = c.url("/dlq", queue=queue)
    elif do is queue_do:
        if action not in _QUEUE_ACTIONS:
            raise ConfigError(f"unknown queue action {action!r}")
        what = f"{_QUEUE_ACTIONS[action]} the queue {queue}"
        back = c.url("/queue", queue=queue)
        if action in ("cancel_job", "remove_job"):
            what = f"{_QUEUE_ACTIONS[action]} the job {first(form, 'id')!r} of {queue}"
            back = c.url("/job", queue=queue, id=first(form, "id"))
        elif action == "clean":
            state, grace_ms, limit = clean_args(form)
            most = f"up to {limit:,}" if limit else "every"
            what = f"{_QUEUE_ACTIONS[action]}: {most} {state} job of {queue} older than {grace_ms:,} ms"
    else:
        if action not in _SPEC_ACTIONS:
            raise ConfigError(f"unknown schedule action {action!r}")
        what = f"{_SPEC_ACTIONS[action]} the spec {first(form, 'key')!r} of {queue}"
        back = c.url("/schedules", queue=queue)
    hidden = "".join(
        f'<input type="hidden" name="{h(k)}" value="{h(v)}">'
        for k, vs in form.items()
        for v in vs
        if k not in ("confirmed",)
    )
    path = {dlq_do: "/dlq/action", queue_do: "/queue/action"}.get(do, "/schedules/action")
    body = (
        f'<h2>Confirm</h2><p class="confirm-what">{h(what)}?</p>'
        f'<form method="post" action="{c.url(path)}" class="confirm">{hidden}'
        '<input type="hidden" name="confirmed" value="1">'
        f'<button type="submit" class="danger" id="confirm">Yes, {h(action.replace("_", " "))}</button> '
        f'<a href="{back}">Cancel</a></form>'
    )
    return c.page("Confirm", body, {dlq_do: "dlq", queue_do: "queues"}.get(do, "schedules"))


def dlq_do(c: Ctx, form: dict[str, list[str]]) -> tuple[str, str, str]:
    queue = first(form, "queue") or ""
    action = first(form, "action")
    ids = form.get("ids") or []
    reason, name = first(form, "reason"), first(form, "name")
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


def spec_do(c: Ctx, form: dict[str, list[str]]) -> tuple[str, str, str]:
    queue = first(form, "queue") or ""
    action = first(form, "action")
    key = first(form, "key") or ""
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


def clean_args(form: dict[str, list[str]]) -> tuple[str, int, int]:
    """The clean form's state, grace (ms) and limit (0: none), checked as ``Queue.clean`` checks them."""
    nums = []
    for key in ("grace_ms", "limit"):
        raw = (first(form, key) or "0").strip()
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 20):
            raise ConfigError(f"clean: {key} must be a whole number of at most 20 digits, got {raw[:40]!r}")
        nums.append(int(raw))
    grace_ms, _, state = check_clean(nums[0], nums[1], first(form, "state") or "")
    return state, grace_ms, nums[1]


def queue_do(c: Ctx, form: dict[str, list[str]]) -> tuple[str, str, str]:
    """Pause or resume a queue (``Queue.pause()``/``resume()``), clean it (``Queue.clean``), or
    cancel or remove one of its jobs (``Queue.cancel``, ``Queue.remove_report``), audited."""
    queue = first(form, "queue") or ""
    action = first(form, "action")
    q = c.source.queue(queue)
    if action == "cancel_job":
        job_id = first(form, "id") or ""
        state = q.cancel(job_id)
        audit(c.user, c.source.label, queue, "job.cancel", job_id=job_id, state=state)
        return f"job {job_id}: cancel {state}", "/job", queue
    if action == "remove_job":
        job_id = first(form, "id") or ""
        found = [place for place, hit in q.remove_report(job_id).items() if hit]
        audit(c.user, c.source.label, queue, "job.remove", job_id=job_id, removed=found)
        if not found:
            return f"job {job_id}: nothing removed (a job a worker read stays: cancel it)", "/job", queue
        return f"job {job_id}: removed from {', '.join(found)}", "/job", queue
    if action == "clean":
        state, grace_ms, limit = clean_args(form)
        ids = q.clean(grace_ms, limit, state)
        audit(
            c.user, c.source.label, queue, "queue.clean", state=state, grace_ms=grace_ms, limit=limit, cleaned=len(ids)
        )
        return f"cleaned {len(ids)} {state} jobs", "/queue", queue
    if action == "pause":
        q.pause()
    elif action == "resume":
        q.resume()
    else:
        raise ConfigError(f"unknown queue action {action!r}")
    paused = q.is_paused()
    audit(c.user, c.source.label, queue, f"queue.{action}", paused=paused)
    return f"{queue} is {'paused' if paused else 'running'}", "/queue", queue
