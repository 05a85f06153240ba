"""``chasqui job show ID --queue Q``: one job's state, data, attempts, outcome and events;
``chasqui job cancel ID --queue Q``: ``SyncQueue.cancel`` (docs/running-jobs.md); ``chasqui job remove ID
--queue Q``: ``SyncQueue.remove_report``.

The lookup is ``SyncQueue.get_job_details`` (``core/job_details.py``): bounded reads only, and
what a bound may have hidden is printed as a note.  The data is shown as indented JSON cut at
``--max-data-bytes``; a failure shows every field its record and DLQ entry carry (reason,
detail, a traceback when the worker kept one).  Exit 4 when nothing at all is known of the id
(the lookup's ``JobNotFound``).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..cli_common import positive_int
from ..core.codec import data_json
from ..core.job_details import JobDetails
from ..core.text import printable
from ..errors import JobNotFound
from .commands import EXIT_FAILED, EXIT_OK, NotFound, add_target, confirm, emit, iso_ms, open_queue, table

__all__ = ["register", "pretty"]


def pretty(value: Any, limit: int) -> str:
    """``value`` as indented JSON (repr for what JSON cannot hold), cut at ``limit`` bytes."""
    text = data_json(value, indent=2, ensure_ascii=False, default=repr, sort_keys=False)
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", "ignore") + f"\n... [{len(raw) - limit} more bytes; --max-data-bytes]"


def _block(out: TextIO, title: str, text: str) -> None:
    out.write(f"\n{title}:\n")
    for line in str(text).splitlines() or [""]:
        out.write(f"  {printable(line)}\n")


def cmd_job_show(args: argparse.Namespace) -> int:  # noqa: C901 - one printed line per optional field of a job
    try:
        d = open_queue(args).get_job_details(args.job_id, group=args.group, events_window=args.events)
    except JobNotFound as exc:
        raise NotFound(str(exc)) from None
    data = d.to_dict()
    cap = args.max_data_bytes
    if args.json:
        for key in ("data", "result"):
            shown = pretty(data[key], cap)
            if len(shown.encode("utf-8")) > cap:
                data[key], data[f"{key}_truncated"] = shown, True

    def human(out: TextIO) -> None:
        rows: list[tuple[str, Any]] = [
            ("queue", d.queue),
            ("id", d.id),
            ("state", d.state),
            ("name", d.name),
            ("attempt", d.attempt),
            ("created", iso_ms(d.created_at_ms)),
        ]
        if d.run_at_ms is not None:
            rows.append(("runs at", iso_ms(d.run_at_ms)))
        if d.entry_id:
            rows.append(("stream entry", d.entry_id))
        if d.consumer:
            rows += [("worker", d.consumer), ("deliveries", d.deliveries), ("idle", f"{d.idle_ms} ms")]
        if d.data_bytes is not None:
            rows.append(("data size", f"{d.data_bytes} bytes"))
        if d.progress is not None:
            rows.append(("progress", pretty(d.progress, 200)))
        table(rows, ("field", "value"), out)
        if d.data_bytes is not None:
            _block(out, "data", pretty(d.data, cap))
        if d.has_result:
            _block(out, "result", pretty(d.result, cap))
        for title, record in (("failure", d.failure), ("dlq entry", d.dlq)):
            if not record:
                continue
            out.write(f"\n{title}:\n")
            for key, value in record.items():
                if key == "finished_at_ms":
                    key, value = "finished", iso_ms(value)
                text = str(value)
                if "\n" in text:
                    _block(out, f"  {key}", text)
                else:
                    out.write(f"  {key}: {printable(text)}\n")
        _story(out, d)

    emit(args, data, human)
    return EXIT_OK


def _story(out: TextIO, d: JobDetails) -> None:
    """The job's log lines, its events and the view's notes."""
    if d.log_lines:
        shown = f"the newest {len(d.logs)} of {d.log_lines}" if d.log_lines > len(d.logs) else str(d.log_lines)
        out.write(f"\nlog ({shown} lines):\n")
        for line in d.logs:
            out.write("  " + printable(line[:1000]) + "\n")
    out.write(f"\nevents ({len(d.events)}{', older ones may exist' if d.events_truncated else ''}):\n")
    for e in d.events:
        extra = " ".join(f"{k}={v[:200]}" for k, v in e.items() if k not in ("event_id", "e", "id", "ts", "n"))
        ts = int(e["ts"]) if e.get("ts", "").isdigit() else None
        out.write(printable(f"  {iso_ms(ts)} {e.get('e', '?')} {extra}".rstrip()) + "\n")
    for note in d.notes:
        out.write(f"note: {printable(note)}\n")


_CANCEL_SAID = {
    "cancelled": "cancelled",
    "requested": "cancel requested: the worker that reads or runs it ends it cancelled",
    "completed": "not cancelled: it had completed",
    "failed": "not cancelled: it had failed",
}


def cmd_job_cancel(args: argparse.Namespace) -> int:
    """``SyncQueue.cancel``: a delayed job ends now, a waiting or running one when a worker meets it."""
    state = open_queue(args).cancel(args.job_id, group=args.group)
    emit(
        args,
        {"job_id": args.job_id, "queue": args.queue, "state": state},
        lambda out: out.write(f"job {args.job_id}: {_CANCEL_SAID.get(state, state)}\n"),
    )
    return EXIT_OK


def cmd_job_remove(args: argparse.Namespace) -> int:
    """``SyncQueue.remove_report``: what is left of a job that is not running, deleted."""
    if not confirm(args, f"delete job {args.job_id} of {args.queue} (a running job stays: cancel it)?", "remove"):
        return EXIT_FAILED
    report = open_queue(args).remove_report(args.job_id)
    where = [part for part, hit in report.items() if hit]

    def human(out: TextIO) -> None:
        job = printable(args.job_id)
        if where:
            out.write(f"job {job}: removed from {', '.join(where)}\n")
        else:
            out.write(f"job {job}: nothing removed (running, ended without records, or unknown)\n")

    emit(args, {"job_id": args.job_id, "queue": args.queue, **report}, human)
    return EXIT_OK


def cmd_job_logs(args: argparse.Namespace) -> int:
    """``SyncQueue.get_job_logs``: the lines a job's handlers logged (``job.log``)."""
    lines, count = open_queue(args).get_job_logs(args.job_id, args.start, args.end, asc=not args.newest_first)

    def human(out: TextIO) -> None:
        for line in lines:
            out.write(printable(line) + "\n")
        if not count:
            out.write(f"job {args.job_id}: no log lines (none logged, or expired a day after the last)\n")

    emit(args, {"job_id": args.job_id, "queue": args.queue, "lines": lines, "count": count}, human)
    return EXIT_OK


def register(sub: Any) -> None:
    job = sub.add_parser("job", help="one job: `job show|logs|cancel|remove ID --queue Q`").add_subparsers(
        dest="job_cmd", required=True
    )
    p = job.add_parser(
        "show", help="state, name, data, attempts, result or failure (with traceback) and events of one job"
    )
    p.add_argument("job_id", metavar="ID", help="the job id (Job.id, the 'job id' column of `dlq peek`)")
    p.add_argument("--queue", "-q", required=True, help="the job's queue")
    p.add_argument("--group", default="default", help="consumer group that runs it (default: default)")
    p.add_argument(
        "--events",
        type=positive_int,
        default=1000,
        help="read the newest N events of the queue for this job's (default 1000)",
    )
    p.add_argument(
        "--max-data-bytes",
        type=positive_int,
        default=4096,
        help="show at most this many bytes of the data and of the result (default 4096)",
    )
    add_target(p)
    p.set_defaults(func=cmd_job_show)
    p = job.add_parser("logs", help="the lines a job's handlers logged (job.log), oldest first")
    p.add_argument("job_id", metavar="ID", help="the job id")
    p.add_argument("--queue", "-q", required=True, help="the job's queue")
    p.add_argument("--start", type=int, default=0, help="first line (0 the oldest; negative from the end)")
    p.add_argument("--end", type=int, default=-1, help="last line, included (default -1: the newest)")
    p.add_argument("--newest-first", action="store_true", help="count and print from the newest line")
    add_target(p)
    p.set_defaults(func=cmd_job_logs)
    p = job.add_parser("cancel", help="cancel a waiting, delayed or running job (never retried nor dead-lettered)")
    p.add_argument("job_id", metavar="ID", help="the job id")
    p.add_argument("--queue", "-q", required=True, help="the job's queue")
    p.add_argument("--group", default="default", help="consumer group that runs it (default: default)")
    add_target(p)
    p.set_defaults(func=cmd_job_cancel)
    p = job.add_parser("remove", help="delete a job that is not running: delayed, waiting, in the DLQ, its records")
    p.add_argument("job_id", metavar="ID", help="the job id")
    p.add_argument("--queue", "-q", required=True, help="the job's queue")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_target(p)
    p.set_defaults(func=cmd_job_remove)
