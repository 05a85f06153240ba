"""``chasqui queues`` (every queue with its counts) and ``chasqui queue drain | clean |
obliterate | pause | resume | limits``.

The listing is :func:`..sync.queue.list_queues` (a capped cursor SCAN, never KEYS), which a
dashboard reuses; drain, clean and obliterate are ``SyncQueue.drain`` / ``clean`` / ``obliterate`` behind a
confirmation (``--yes`` for scripts).  Exit codes as the other operator commands; obliterate
refused because workers are active exits 1.
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from ..cli_common import DEFAULT_URL, non_negative_int, resolve_url
from ..cli_common import positive_int as _positive
from ..core.controls import read_controls
from ..core.removal import CLEAN_STATES
from ..core.text import printable
from ..sync.queue import list_queues
from .commands import EXIT_FAILED, EXIT_OK, add_target, confirm, emit, open_queue, table, write_spoiled

__all__ = ["register"]


def cmd_queues(args: argparse.Namespace) -> int:
    args.resolved_url, _ = resolve_url(args.redis_url, args.conn_id, DEFAULT_URL)
    listing = list_queues(
        args.resolved_url, match=args.match, limit=args.limit, cursor=args.cursor, max_scan_calls=args.max_scan_calls
    )

    def human(out: TextIO) -> None:
        table(
            [
                (
                    q.queue,
                    q.waiting if not q.prioritized else f"{q.waiting} (+{q.prioritized} prioritized)",
                    q.pending,
                    q.delayed,
                    q.dlq,
                    q.specs if not q.paused_specs else f"{q.specs} (+{q.paused_specs} paused)",
                    q.consumers,
                    q.workers,
                    _state(q.paused, q.rate_limit, q.concurrency),
                )
                for q in listing.queues
            ],
            ("queue", "waiting", "pending", "delayed", "dlq", "specs", "consumers", "live workers", "state"),
            out,
        )
        if not listing.queues:
            out.write(f"no queue matches {args.match!r}\n")
        for q in listing.queues:
            write_spoiled(q.spoiled, out)
        if listing.truncated:
            more = f" --cursor {listing.cursor}" if listing.cursor != "0" else " a higher --limit"
            out.write(
                f"\ntruncated after {listing.scan_calls} SCAN calls / {args.limit} queues: more queues may "
                f"exist (continue with{more}, or raise --max-scan-calls)\n"
            )

    emit(args, listing.to_dict(), human)
    return EXIT_OK


def cmd_drain(args: argparse.Namespace) -> int:
    q = open_queue(args)
    what = "waiting jobs" if args.keep_delayed else "waiting and delayed jobs"
    if not confirm(args, f"delete the {what} of {args.queue}? (running jobs stay)", "drain"):
        return EXIT_FAILED
    report = q.drain(delayed=not args.keep_delayed)

    def human(out: TextIO) -> None:
        out.write(f"drained {args.queue}: {report.waiting} waiting and {report.delayed} delayed jobs deleted\n")

    emit(args, {"queue": args.queue, **report.to_dict()}, human)
    return EXIT_OK


def cmd_clean(args: argparse.Namespace) -> int:
    q = open_queue(args)
    older = f"older than {args.grace_ms} ms" if args.grace_ms else "of any age"
    many = f"up to {args.limit}" if args.limit else "all"
    if not confirm(args, f"delete {many} {args.state} jobs {older} of {args.queue}? (running jobs stay)", "clean"):
        return EXIT_FAILED
    removed = q.clean(args.grace_ms, args.limit, args.state)

    def human(out: TextIO) -> None:
        out.write(f"cleaned {args.queue}: {len(removed)} {args.state} jobs deleted\n")
        for job_id in removed:
            out.write(f"  {printable(job_id)}\n")

    emit(args, {"queue": args.queue, "state": args.state, "removed": removed}, human)
    return EXIT_OK


def cmd_obliterate(args: argparse.Namespace) -> int:
    q = open_queue(args)
    if not confirm(args, f"delete EVERY key of queue {args.queue} (jobs, DLQ, events, results, specs)?", "obliterate"):
        return EXIT_FAILED
    report = q.obliterate(force=args.force)

    def human(out: TextIO) -> None:
        swept = "not run (Redis Cluster)" if report.swept is None else str(report.swept)
        out.write(
            f"obliterated {args.queue}: {report.keys} keys, {report.indexed} indexed entries, "
            f"{swept} more keys found by the final scan\n"
        )

    emit(args, {"queue": args.queue, **report.to_dict()}, human)
    return EXIT_OK


def _state(paused: bool, rate: Any, concurrency: int | None = None) -> str:
    parts = ["paused"] if paused else []
    if rate is not None:
        parts.append(f"{rate.max_jobs}/{rate.per_ms}ms")
    if concurrency is not None:
        parts.append(f"max {concurrency} running")
    return ", ".join(parts)


def cmd_limits(args: argparse.Namespace) -> int:
    """``chasqui queue limits Q``: show the limits; ``--rate N/MS`` and ``--concurrency N``
    set them, ``--clear`` removes both."""
    q = open_queue(args)
    if args.clear:
        q.clear_rate_limit()
        q.clear_concurrency()
    if args.rate is not None:
        q.set_rate_limit(*args.rate)
    if args.concurrency is not None:
        q.set_concurrency(args.concurrency)
    ctl = q.driver.run(read_controls(q.keys))
    rate, paused, concurrency = ctl.rate, ctl.paused, ctl.concurrency
    body = {
        "queue": args.queue,
        "paused": paused,
        "rate_limit": None if rate is None else {"max_jobs": rate.max_jobs, "per_ms": rate.per_ms},
        "concurrency": concurrency,
    }

    def human(out: TextIO) -> None:
        limit = "none" if rate is None else f"at most {rate.max_jobs} jobs per {rate.per_ms} ms (all workers together)"
        running = "none" if concurrency is None else f"at most {concurrency} jobs at once (all workers together)"
        out.write(f"{args.queue}: {'paused' if paused else 'running'}; rate limit: {limit}; concurrency: {running}\n")

    emit(args, body, human)
    return EXIT_OK


def _rate(text: str) -> tuple[int, int]:
    """``N/MS``: N jobs per MS milliseconds."""
    jobs, sep, per = text.partition("/")
    try:
        if not sep:
            raise ValueError
        return int(jobs), int(per.removesuffix("ms"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected JOBS/MILLISECONDS such as 10/1000, got {text!r}") from None


def cmd_pause(args: argparse.Namespace) -> int:
    """``Queue.pause()``/``resume()``: every worker obeys it within 100 ms (``engine/flow_gate.py``)."""
    q = open_queue(args)
    if args.queue_cmd == "pause":
        q.pause()
    else:
        q.resume()
    paused = q.is_paused()

    def human(out: TextIO) -> None:
        if paused:
            out.write(f"{args.queue} is paused: no worker starts its jobs (running jobs finish)\n")
        else:
            out.write(f"{args.queue} is running: workers start its jobs\n")

    emit(args, {"queue": args.queue, "paused": paused}, human)
    return EXIT_OK


def register(sub: Any) -> None:
    p = sub.add_parser("queues", help="every queue on the server with its counts (a capped cursor SCAN)")
    p.add_argument("--match", default="*", help="only queues whose name matches this glob (default: all)")
    p.add_argument("--limit", type=_positive, default=1000, help="list at most this many queues (default 1000)")
    p.add_argument(
        "--max-scan-calls",
        type=_positive,
        default=100,
        help="stop the SCAN after this many calls of 1,000 keys (default 100); the output says when it stopped early",
    )
    p.add_argument("--cursor", default="0", help="continue a truncated listing from the cursor it printed")
    add_target(p)
    p.set_defaults(func=cmd_queues)

    queue = sub.add_parser(
        "queue", help="act on one queue: drain, clean, obliterate, pause, resume, limits"
    ).add_subparsers(dest="queue_cmd", required=True)
    p = queue.add_parser(
        "drain", help="delete the waiting and delayed jobs; running jobs, the DLQ, results and specs stay"
    )
    p.add_argument("queue", help="queue name")
    p.add_argument("--keep-delayed", action="store_true", help="delete the waiting jobs only")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_target(p)
    p.set_defaults(func=cmd_drain)
    p = queue.add_parser("clean", help="delete the jobs of one state older than a grace time; running jobs stay")
    p.add_argument("queue", help="queue name")
    p.add_argument("--state", choices=CLEAN_STATES, required=True, help="completed means stored results")
    p.add_argument(
        "--grace-ms", type=non_negative_int, default=0, help="only jobs older than this many ms (default 0: any)"
    )
    p.add_argument("--limit", type=non_negative_int, default=1000, help="delete at most N (default 1000; 0: no limit)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_target(p)
    p.set_defaults(func=cmd_clean)
    p = queue.add_parser("obliterate", help="delete every key of the queue; refused while workers use it")
    p.add_argument("queue", help="queue name")
    p.add_argument(
        "--force",
        action="store_true",
        help="go ahead even with running jobs, live consumers or a promoter/scheduler lock held",
    )
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_target(p)
    p.set_defaults(func=cmd_obliterate)
    for verb, helptext in (
        ("pause", "no worker starts a new job of the queue (running jobs finish; producers go on)"),
        ("resume", "workers start the queue's jobs again"),
    ):
        p = queue.add_parser(verb, help=helptext)
        p.add_argument("queue", help="queue name")
        add_target(p)
        p.set_defaults(func=cmd_pause)
    p = queue.add_parser(
        "limits",
        help="show the queue's limits; --rate 10/1000 and --concurrency 4 set them, --clear removes them",
    )
    p.add_argument("queue", help="queue name")
    p.add_argument("--rate", type=_rate, help="JOBS/MILLISECONDS: all workers together start at most that many")
    p.add_argument(
        "--concurrency", type=_positive, help="N: at most N jobs of the queue run at once, all workers together"
    )
    p.add_argument("--clear", action="store_true", help="remove both limits first (then set what is given)")
    add_target(p)
    p.set_defaults(func=cmd_limits)
