"""The operator's commands ``chasqui inspect | workers | watch | events`` (and ``functions``,
in ``functions.py``), and what every command group shares: the output helpers, the Redis
options, confirmation and the error boundary (:func:`run`).  ``dlq.py``, ``repeatable.py``,
``jobs.py`` and ``queues.py`` hold the other groups.

Tables for people, ``--json`` for scripts.  Exit codes: 0 ok, 1 failed, 2 bad usage,
3 Redis unreachable, 4 not found.  Errors name the problem and the fix, and never show a
password (every message goes through ``core.urls.redact_text``).  Redis is ``--redis-url``,
else ``--conn-id`` (an Airflow connection), else ``$CHASQUI_REDIS_URL``, else
``redis://127.0.0.1:6379``.  Blocking code on ``SyncQueue``/``SyncDriver``: no event loop;
Airflow is imported only for ``--conn-id``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from ..cli_common import DEFAULT_URL, non_negative_int, positive_int, resolve_url
from ..core.calls import str_reply
from ..core.codec import data_json, now_ms
from ..core.event_follow import EventCursor
from ..core.inspect import snapshot
from ..core.keys import QueueKeys
from ..core.liveness import WORKER_COLUMNS, read_workers, worker_row
from ..core.producer import parse_fields
from ..core.text import printable
from ..core.urls import WAIT_BLOCK_MS, redact_text, redact_url
from ..errors import ChasquiConnectionError, ChasquiError, ConfigError
from ..sync import translate_errors
from ..sync.queue import SyncQueue

__all__ = [
    "register",
    "run",
    "add_common",
    "add_target",
    "open_queue",
    "confirm",
    "emit",
    "table",
    "iso_ms",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "EXIT_UNREACHABLE",
    "EXIT_NOT_FOUND",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND = 0, 1, 2, 3, 4


class NotFound(ChasquiError):
    """A named spec or entry does not exist (exit code 4)."""


# ---- output helpers ------------------------------------------------------------------------
def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO) -> None:
    """Columns for people; every cell's control characters escaped (``core.text.printable``)."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else printable(str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, r in enumerate(cells):
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def iso_ms(ms: int | str | None) -> str:
    if not ms:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")  # type: ignore[operator]
    except (TypeError, ValueError, OverflowError, OSError):  # no instant ("inf") or beyond year 9999
        return f"{ms} (no date)"


def emit(args: argparse.Namespace, data: Any, human: Callable[[TextIO], object]) -> None:
    if args.json:
        sys.stdout.write(data_json(data, default=str) + "\n")  # whole or nothing: a job's data may hold a tuple key
    else:
        human(sys.stdout)


def open_queue(args: argparse.Namespace) -> SyncQueue:
    args.resolved_url, _ = resolve_url(args.redis_url, args.conn_id, DEFAULT_URL)
    return SyncQueue(args.queue, redis_url=args.resolved_url)


def confirm(args: argparse.Namespace, question: str, action: str | None = None) -> bool:
    """``--yes``, or a "y" typed on a terminal; refuses (ConfigError) without a terminal."""
    if args.yes:
        return True
    if not sys.stdin.isatty():
        raise ConfigError(
            f"refusing to {action or args.dlq_cmd} without confirmation: pass --yes when not on a terminal"
        )
    if input(f"{question} [y/N] ").strip().lower() == "y":
        return True
    print("cancelled")
    return False


# ---- inspect / watch ----------------------------------------------------------------------
def _snapshot(q: SyncQueue, group: str) -> Any:
    return q.driver.run(snapshot(q.name, group=group, now_ms=now_ms()))


def _print_snapshot(s: Any, out: TextIO, prev: Any = None) -> None:
    def delta(field: str) -> str:
        return "" if prev is None else f" ({getattr(s, field) - getattr(prev, field):+d})"

    lag = "-" if s.oldest_delayed_lag_ms is None else f"{s.oldest_delayed_lag_ms} ms"
    rows = [
        ("state", "paused (no worker starts its jobs)" if s.paused else "running"),
        (
            "rate limit",
            "none" if s.rate_limit is None else f"{s.rate_limit.max_jobs} jobs per {s.rate_limit.per_ms} ms",
        ),
        ("concurrency", "none" if s.concurrency is None else f"{s.slots_held} of {s.concurrency} slots held"),
        ("stream", f"{s.stream}{delta('stream')}"),
        ("prioritized", f"{s.prioritized} (added with a priority, not in the stream yet)"),
        (
            "job groups",
            f"{s.job_groups} with waiting jobs"
            + "".join(f"; {g}: {w} waiting, {r} running" for g, w, r in s.job_group_rows),
        ),
        ("pending", s.pending if s.group_exists else "0 (group not created)"),
        ("delayed", f"{s.delayed} (oldest lag {lag})"),
        ("dlq", f"{s.dlq}{delta('dlq')}"),
        ("repeatable specs", f"{s.specs} active, {s.paused_specs} paused"),
        ("promoter leader", s.promoter_leader),
        ("scheduler leader", s.scheduler_leader),
    ]
    out.write(f"queue {s.queue}\n")
    table(rows, ("what", "value"), out)
    write_spoiled(s.spoiled, out)
    if s.consumers:
        out.write("\n")
        said = {True: "alive", False: "gone", None: "no heartbeat"}
        table(
            [(c.name, said[c.live], c.pending, f"{c.idle_ms} ms") for c in s.consumers],
            ("consumer", "heartbeat", "pending", "idle"),
            out,
        )
    if s.workers:
        out.write("\n")
        table([worker_row(w, now_ms()) for w in s.workers], WORKER_COLUMNS, out)
    if s.next_fires:
        out.write("\n")
        table([(k, iso_ms(ms)) for k, ms in s.next_fires], ("next fires", "at (UTC)"), out)


def write_spoiled(spoiled: dict[str, str], out: TextIO) -> None:
    """The keys a view read as empty because they hold another type (core/key_types.py)."""
    for key, found in spoiled.items():
        out.write(f"warning: {key} holds a {found} (foreign or hostile data): counted as empty\n")


def cmd_inspect(args: argparse.Namespace) -> int:
    s = _snapshot(open_queue(args), args.group)
    emit(args, s.to_dict(), lambda out: _print_snapshot(s, out))
    return EXIT_OK


def cmd_workers(args: argparse.Namespace) -> int:
    """``chasqui workers QUEUE``: the worker processes that beat on a queue (alive or lately gone)."""
    q = open_queue(args)
    now = now_ms()
    workers = q.driver.run(read_workers(q.keys, now))

    def human(out: TextIO) -> None:
        if not workers:
            out.write(f"no worker beats on {args.queue} (none runs, or only ChasquiMQ workers)\n")
            return
        table([worker_row(w, now) for w in workers], WORKER_COLUMNS, out)

    emit(args, {"queue": args.queue, "workers": [w.to_dict() for w in workers]}, human)
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    q = open_queue(args)
    prev = None
    n = 0
    try:
        while args.iterations is None or n < args.iterations:
            s = _snapshot(q, args.group)
            if args.json:
                print(json.dumps(s.to_dict(), default=str), flush=True)
            else:
                sys.stdout.write("\x1b[H\x1b[2J" + time.strftime("%H:%M:%S") + f"  every {args.interval_ms} ms\n")
                _print_snapshot(s, sys.stdout, prev)
                sys.stdout.flush()
            prev, n = s, n + 1
            if args.iterations is None or n < args.iterations:
                time.sleep(args.interval_ms / 1000)
    except KeyboardInterrupt:
        pass
    return EXIT_OK


# ---- events -------------------------------------------------------------------------------
def format_event(entry_id: Any, flat: list[Any]) -> str:
    f = {k: str_reply(v) for k, v in parse_fields(flat).items()}
    ts = int(f.pop("ts", "0") or 0)
    kind, jid, name = f.pop("e", "?"), f.pop("id", "") or "-", f.pop("n", "") or "-"
    extra = " ".join(f"{k}={v[:80]}" for k, v in sorted(f.items()))
    line = f"{iso_ms(ts)} {str_reply(entry_id)} {kind} id={jid} name={name}" + (f" {extra}" if extra else "")
    return printable(line)  # one event, one line, nothing a terminal would obey


def cmd_events(args: argparse.Namespace) -> int:
    block = min(args.block_ms, WAIT_BLOCK_MS) if args.follow else None  # within the socket timeout
    cursor = EventCursor(QueueKeys.for_queue(args.queue), args.from_id, count=100, block_ms=block)
    q = open_queue(args)
    if not cursor.pinned:
        cursor.pin(q.driver.call(cursor.pin_call()))
    shown = 0
    try:
        while True:
            rows = q.driver.call(cursor.read_call())
            for entry_id, flat in cursor.consume(rows):
                if args.json:
                    f = {k: str_reply(v) for k, v in parse_fields(flat).items()}
                    print(json.dumps({"event_id": entry_id, **f}), flush=True)
                else:
                    print(format_event(entry_id, flat), flush=True)
                shown += 1
                if args.max_events and shown >= args.max_events:
                    return EXIT_OK
            if not args.follow and not rows:
                return EXIT_OK
            if not rows and cursor.stuck:  # at the largest id: read on once the stream moved on
                cursor.unstick(q.driver.call(cursor.end_call()))
    except KeyboardInterrupt:
        return EXIT_OK


# ---- wiring -------------------------------------------------------------------------------
def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("queue", help="queue name")
    add_target(p)


def add_target(p: argparse.ArgumentParser) -> None:
    """--redis-url / --conn-id (else $CHASQUI_REDIS_URL) and --json: every command has them."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--redis-url",
        help=f"Redis URL (default: $CHASQUI_REDIS_URL, else {DEFAULT_URL}; "
        "prefer the environment: argv is visible in ps)",
    )
    where.add_argument("--conn-id", help="an Airflow 'chasqui' connection id instead of a URL (imports Airflow)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def register(sub: Any) -> None:
    """Add the operator subcommands to the ``chasqui`` parser's subparsers."""
    p = sub.add_parser("inspect", help="stream, pending, delayed, DLQ, specs, leaders of a queue")
    add_common(p)
    p.add_argument(
        "--group", default="default", help="consumer group whose pending entries to count (default: default)"
    )
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("workers", help="the worker processes of a queue: host, pid, handlers, uptime, health")
    add_common(p)
    p.set_defaults(func=cmd_workers)

    p = sub.add_parser("watch", help="a live view of `inspect` that refreshes in place")
    add_common(p)
    p.add_argument(
        "--group", default="default", help="consumer group whose pending entries to count (default: default)"
    )
    p.add_argument("--interval-ms", type=positive_int, default=1000, help="refresh period in ms (default 1000)")
    p.add_argument("--iterations", type=positive_int, default=None, help="stop after N refreshes")
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("events", help="print the events stream")
    add_common(p)
    p.add_argument("--from", dest="from_id", default="0-0", help="start id ('$' = only new events)")
    p.add_argument("--follow", "-f", action="store_true", help="keep waiting for new events")
    p.add_argument(
        "--block-ms", type=positive_int, default=5000, help="with --follow: how long one read waits (default 5000)"
    )
    p.add_argument("--max-events", type=non_negative_int, default=0, help="stop after N events (0 = no limit)")
    p.set_defaults(func=cmd_events)

    from .functions import register as register_functions  # it imports this module

    register_functions(sub)


def run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand, mapping errors to exit codes with a one-line message on stderr."""

    def say(text: str) -> None:
        print(f"chasqui: {redact_text(text)}", file=sys.stderr)

    try:
        with translate_errors():
            return func(args)
    except NotFound as exc:
        say(str(exc))
        return EXIT_NOT_FOUND
    except ChasquiConnectionError as exc:
        url = getattr(args, "resolved_url", None)
        say(
            f"{exc} -- is Redis running at {redact_url(url) if url else '?'}? "
            "Pass --redis-url (or set CHASQUI_REDIS_URL, or --conn-id) to point elsewhere."
        )
        return EXIT_UNREACHABLE
    except ConfigError as exc:
        say(str(exc))
        return EXIT_USAGE
    except ChasquiError as exc:
        say(str(exc))
        return EXIT_FAILED
