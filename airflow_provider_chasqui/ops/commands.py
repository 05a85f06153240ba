"""The operator's commands: ``chasqui inspect | dlq | repeatable | events | watch`` (and
``functions``, in ``functions.py``).

Tables for people, ``--json`` for scripts.  Exit codes: 0 ok, 1 failed, 2 bad usage,
3 Redis unreachable, 4 not found.  Errors name the problem and the fix, and never show a
password (every message goes through ``core.urls.redact_text``).  Redis is ``--redis-url``,
else ``--conn-id`` (an Airflow connection), else ``$CHASQUI_REDIS_URL``, else
``redis://127.0.0.1:6379``.  Blocking code on ``SyncQueue``/``SyncDriver``: no event loop;
Airflow is imported only for ``--conn-id``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from ..cli_common import DEFAULT_URL, resolve_url
from ..core.calls import command, str_reply
from ..core.codec import now_ms
from ..core.event_follow import EventCursor
from ..core.inspect import snapshot
from ..core.keys import QueueKeys
from ..core.liveness import WorkerRecord, read_workers
from ..core.producer import parse_fields
from ..core.text import printable
from ..core.urls import WAIT_BLOCK_MS, redact_text, redact_url
from ..errors import ChasquiConnectionError, ChasquiError, ConfigError
from ..sync import translate_errors
from ..sync.queue import SyncQueue

__all__ = [
    "register",
    "add_target",
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
        json.dump(data, sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        human(sys.stdout)


def _queue(args: argparse.Namespace) -> SyncQueue:
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
        table(workers_rows(s.workers, now_ms()), WORKER_HEADS, out)
    if s.next_fires:
        out.write("\n")
        table([(k, iso_ms(ms)) for k, ms in s.next_fires], ("next fires", "at (UTC)"), out)


def write_spoiled(spoiled: dict[str, str], out: TextIO) -> None:
    """The keys a view read as empty because they hold another type (core/key_types.py)."""
    for key, found in spoiled.items():
        out.write(f"warning: {key} holds a {found} (foreign or hostile data): counted as empty\n")


def cmd_inspect(args: argparse.Namespace) -> int:
    s = _snapshot(_queue(args), args.group)
    emit(args, s.to_dict(), lambda out: _print_snapshot(s, out))
    return EXIT_OK


WORKER_HEADS = ("worker", "state", "host", "pid", "version", "handlers", "concurrency", "up", "last beat", "health")


def workers_rows(workers: Iterable[WorkerRecord], now: int) -> list[tuple[Any, ...]]:
    """One row per worker that beats (``core/liveness.py``): who, where, since when, how."""
    return [
        (
            w.consumer,
            "alive" if w.live else "gone",
            w.host or "-",
            w.pid if w.pid is not None else "-",
            w.version or "-",
            ", ".join(w.handlers) or "-",
            w.concurrency if w.concurrency is not None else "-",
            f"{(now - w.started_ms) // 1000} s" if w.started_ms else "-",
            f"{(now - w.beat_ms) / 1000:.1f} s ago" if w.beat_ms else "-",
            {True: "ok", False: "unhealthy", None: "-"}[w.ok],
        )
        for w in workers
    ]


def cmd_workers(args: argparse.Namespace) -> int:
    """``chasqui workers QUEUE``: the worker processes that beat on a queue (alive or lately gone)."""
    q = _queue(args)
    now = now_ms()
    workers = q.driver.run(read_workers(q.keys, now))

    def human(out: TextIO) -> None:
        if not workers:
            out.write(f"no worker beats on {args.queue} (none runs, or only ChasquiMQ workers)\n")
            return
        table(workers_rows(workers, now), WORKER_HEADS, out)

    emit(args, {"queue": args.queue, "workers": [w.to_dict() for w in workers]}, human)
    return EXIT_OK


def cmd_watch(args: argparse.Namespace) -> int:
    q = _queue(args)
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


# ---- dlq ----------------------------------------------------------------------------------
_HANDLER_PREFIX = "handler: Python handler raised: "  # ChasquiMQ's reason prefix; the table shows the error


def _last_line(text: str | None) -> str:
    """A traceback's last line (``ValueError: boom``): what a one-line table can show of it."""
    return (text or "").rstrip().rpartition("\n")[2]


def cmd_dlq_peek(args: argparse.Namespace) -> int:
    rows = _queue(args).peek_dlq(args.limit)
    data = [{**r, "payload_bytes": len(r["payload"]), "payload": None} for r in rows]

    def human(out: TextIO) -> None:
        table(
            [
                (
                    r["dlq_id"],
                    r["job_id"] or "-",
                    r["name"] or "-",
                    r["reason"],
                    (r["error"] or _last_line(r["traceback"]) or r["detail"] or "").removeprefix(_HANDLER_PREFIX)[:60],
                    r["payload_bytes"],
                )
                for r in data
            ],
            ("dlq id", "job id", "name", "reason", "error / detail", "bytes"),
            out,
        )
        counts: dict[str, int] = {}
        for r in data:
            counts[r["reason"]] = counts.get(r["reason"], 0) + 1
        out.write(
            "\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + "\n" if counts else "DLQ is empty\n"
        )

    emit(args, data, human)
    return EXIT_OK


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    if not confirm(args, f"replay up to {args.limit} DLQ entries of {args.queue}?"):
        return EXIT_FAILED
    report = _queue(args).replay_dlq_report(args.limit)
    n, skipped = report["replayed"], report["skipped"]

    def human(out: TextIO) -> None:
        out.write(f"replayed {n} of {args.limit} entries\n")
        if skipped:
            out.write(
                f"skipped {skipped} undecodable entries (they stay; `chasqui dlq peek` shows them, "
                "`chasqui dlq remove` deletes them)\n"
            )

    emit(args, {"replayed": n, "limit": args.limit, "skipped": skipped}, human)
    return EXIT_OK


def cmd_dlq_remove(args: argparse.Namespace) -> int:
    q = _queue(args)
    if not confirm(args, f"delete {len(args.ids)} DLQ entries of {args.queue}?"):
        return EXIT_FAILED
    n = q.remove_dlq(args.ids)
    emit(
        args, {"removed": n, "asked": len(args.ids)}, lambda out: out.write(f"removed {n} of {len(args.ids)} entries\n")
    )
    if n < len(args.ids) and not args.json:
        sys.stderr.write(f"chasqui: {len(args.ids) - n} id(s) were not in the DLQ of {args.queue}\n")
    return EXIT_OK if n == len(args.ids) else EXIT_NOT_FOUND


def cmd_dlq_purge(args: argparse.Namespace) -> int:
    q = _queue(args)
    which = " and ".join(f"{k} {v!r}" for k, v in (("reason", args.reason), ("name", args.name)) if v is not None)
    total = int(q.driver.call(command("XLEN", q.keys.dlq)))
    question = (
        f"delete the DLQ entries with {which} of {args.queue} (of {total})?"
        if which
        else f"delete all {total} DLQ entries of {args.queue}?"
    )
    if not confirm(args, question):
        return EXIT_FAILED
    n = q.purge_dlq(reason=args.reason, name=args.name)
    emit(args, {"purged": n}, lambda out: out.write(f"purged {n} entries\n"))
    return EXIT_OK


# ---- repeatable ---------------------------------------------------------------------------
def _meta_dict(m: Any) -> dict[str, Any]:
    if m.corrupt:  # a spec that cannot be read: its key (escaped), score text and the reason
        return {"key": m.key, "corrupt": True, "reason": m.reason, "score": m.score, "paused": m.paused}
    p = m.pattern
    return {
        "key": m.key,
        "job_name": m.job_name,
        "kind": p.kind,
        "pattern": p.expression if p.kind == "cron" else f"every {p.interval_ms}ms",
        "tz": (p.tz or "UTC") if p.kind == "cron" else None,
        "next_fire_ms": m.next_fire_ms,
        "next_fire": iso_ms(m.next_fire_ms),
        "limit": m.limit,
        "paused": getattr(m, "paused", False),
        "fired": getattr(m, "fired", 0),
        "skipped": getattr(m, "skipped", 0),
        "corrupt": False,
    }


def cmd_repeatable_list(args: argparse.Namespace) -> int:
    items, cursor = _queue(args).list_repeatable(cursor=args.cursor, count=args.limit)
    data: dict[str, Any] = {"items": [_meta_dict(m) for m in items], "next_cursor": cursor}

    def human(out: TextIO) -> None:
        rows = []
        for d in data["items"]:
            if d["corrupt"]:
                rows.append((d["key"], "-", "-", "-", d["score"], "-", "CORRUPT", "-"))
            else:
                rows.append(
                    (
                        d["key"],
                        d["job_name"],
                        d["pattern"],
                        d["tz"],
                        d["next_fire"],
                        d["limit"],
                        "paused" if d["paused"] else "active",
                        d["fired"],
                    )
                )
        table(rows, ("key", "job", "pattern", "tz", "next fire (UTC)", "limit", "state", "fired"), out)
        bad = [d for d in data["items"] if d["corrupt"]]
        if bad:
            out.write(f"\n{len(bad)} corrupt spec(s):\n")
            for d in bad:
                out.write(f"  {d['key']}: {d['reason']}\n")
        if cursor:
            out.write(f"\nmore: --cursor {cursor}\n")

    emit(args, data, human)
    return EXIT_OK


def cmd_repeatable_get(args: argparse.Namespace) -> int:
    meta = _queue(args).get_repeatable_job(args.key)
    if meta is None:
        raise NotFound(f"no repeatable spec with key {args.key!r} on queue {args.queue!r} (see `repeatable list`)")
    d = _meta_dict(meta)
    emit(args, d, lambda out: table(list(d.items()), ("field", "value"), out))
    return EXIT_OK


def _spec_action(verb: str) -> Callable[[argparse.Namespace], int]:
    method = {"pause": "pause_repeatable", "resume": "resume_repeatable", "remove": "remove_repeatable_by_key"}[verb]

    def run(args: argparse.Namespace) -> int:
        ok = getattr(_queue(args), method)(args.key)
        if not ok:
            raise NotFound(f"no repeatable spec with key {args.key!r} to {verb} on queue {args.queue!r}")
        done = {"pause": "paused", "resume": "resumed", "remove": "removed"}[verb]
        emit(args, {"key": args.key, done: True}, lambda out: out.write(f"{done} {args.key}\n"))
        return EXIT_OK

    return run


def _read_rows(path: str) -> Iterable[dict[str, Any]]:
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq  # only for Parquet imports

        for batch in pq.ParquetFile(path).iter_batches(batch_size=10_000):
            yield from batch.to_pylist()
    else:
        with open(path, newline="", encoding="utf-8") as fh:
            yield from csv.DictReader(fh)


def _row_to_spec(row: dict[str, Any], line: int) -> dict[str, Any]:
    from ..core.repeat import RepeatPattern

    name = row.get("name") or row.get("job_name")
    if not name:
        raise ConfigError(f"row {line}: a 'name' column is required")
    if row.get("cron"):
        pattern = RepeatPattern.cron(str(row["cron"]), tz=row.get("tz") or None)
    elif row.get("every_ms"):
        pattern = RepeatPattern.every(int(row["every_ms"]))
    else:
        raise ConfigError(f"row {line}: give a 'cron' (with optional 'tz') or an 'every_ms' column")
    data = row.get("data")
    if isinstance(data, str) and data:
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"row {line}: 'data' is not JSON: {exc}") from exc
        except RecursionError as exc:  # a row is data: it gets a row error, never a traceback
            raise ConfigError(f"row {line}: 'data' is nested too deeply to import") from exc
    spec = {"name": str(name), "data": data, "repeat": pattern}
    if row.get("key"):
        spec["key"] = str(row["key"])
    return spec


def _valid_rows(queue: str, path: str, errors: list[str] | None) -> Iterable[dict[str, Any]]:
    """The rows of ``path`` as upsert items, each checked as the upsert will encode it;
    a bad row raises ConfigError naming its row number, or, with ``errors``, is noted there
    and left out."""
    from ..core.schedules import SpecFlows

    specs = SpecFlows(queue)  # the CLI's SyncQueue has the default settings too
    caches: tuple[dict[Any, Any], dict[Any, Any]] = ({}, {})
    now = now_ms()
    for line, row in enumerate(_read_rows(path), start=2):
        try:
            spec = _row_to_spec(row, line)
            specs.prepare_bulk([spec], now, caches)
        except (ChasquiError, ValueError, TypeError) as exc:
            text = str(exc)
            message = text if text.startswith(f"row {line}:") else f"row {line}: {text}"
            if errors is None:
                raise ConfigError(message) from exc
            errors.append(message)
            continue
        yield spec


def cmd_repeatable_import(args: argparse.Namespace) -> int:
    """Two passes over the file: every row is validated first (all errors reported, with row
    numbers) and nothing is written unless all are valid (or ``--skip-invalid``); then the
    valid rows are written in batches.  ``--dry-run`` stops after the first pass."""
    errors: list[str] = []
    try:
        valid = sum(1 for _ in _valid_rows(args.queue, args.file, errors))
    except (OSError, UnicodeError, csv.Error) as exc:
        raise ConfigError(f"cannot read {args.file}: {exc}") from exc
    if errors and not args.skip_invalid:
        shown = "\n  ".join(errors[:20]) + (f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else "")
        raise ConfigError(
            f"{len(errors)} invalid row(s) in {args.file}; nothing was imported "
            f"(fix them, or pass --skip-invalid to import the {valid} valid rows):\n  {shown}"
        )
    for message in errors:
        print(f"chasqui: skipped {message}", file=sys.stderr)
    if args.dry_run:
        emit(
            args,
            {"valid": valid, "invalid": len(errors), "imported": 0},
            lambda out: out.write(f"{valid} valid rows, {len(errors)} invalid; nothing imported (--dry-run)\n"),
        )
        return EXIT_OK
    q = _queue(args)
    total, batch = 0, []
    started = time.monotonic()
    for spec in _valid_rows(args.queue, args.file, [] if args.skip_invalid else None):
        batch.append(spec)
        if len(batch) >= args.batch:
            total += len(q.upsert_repeatable_bulk(batch))
            batch = []
            _progress(total, started)
    if batch:
        total += len(q.upsert_repeatable_bulk(batch))
    _progress(total, started, final=True)
    emit(
        args,
        {"imported": total, **({"invalid": len(errors)} if errors else {})},
        lambda out: out.write(
            f"imported {total} specs into {args.queue}"
            + (f" ({len(errors)} invalid rows skipped)" if errors else "")
            + "\n"
        ),
    )
    return EXIT_OK


def _progress(n: int, started: float, final: bool = False) -> None:
    if sys.stderr.isatty() or final:
        rate = n / max(1e-6, time.monotonic() - started)
        sys.stderr.write(f"\r{n:,} specs imported ({rate:,.0f}/s)" + ("\n" if final else ""))
        sys.stderr.flush()


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
    q = _queue(args)
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
    except KeyboardInterrupt:
        return EXIT_OK


# ---- wiring -------------------------------------------------------------------------------
def _common(p: argparse.ArgumentParser) -> None:
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


def register(sub: Any) -> None:  # noqa: PLR0915 - argparse declarations, one statement per option
    """Add the operator subcommands to the ``chasqui`` parser's subparsers."""
    p = sub.add_parser("inspect", help="stream, pending, delayed, DLQ, specs, leaders of a queue")
    _common(p)
    p.add_argument(
        "--group", default="default", help="consumer group whose pending entries to count (default: default)"
    )
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("workers", help="the worker processes of a queue: host, pid, handlers, uptime, health")
    _common(p)
    p.set_defaults(func=cmd_workers)

    p = sub.add_parser("watch", help="a live view of `inspect` that refreshes in place")
    _common(p)
    p.add_argument(
        "--group", default="default", help="consumer group whose pending entries to count (default: default)"
    )
    p.add_argument("--interval-ms", type=int, default=1000, help="refresh period in ms (default 1000)")
    p.add_argument("--iterations", type=int, default=None, help="stop after N refreshes")
    p.set_defaults(func=cmd_watch)

    dlq = sub.add_parser("dlq", help="dead-letter queue").add_subparsers(dest="dlq_cmd", required=True)
    p = dlq.add_parser("peek", help="show DLQ entries (payloads not decoded)")
    _common(p)
    p.add_argument("--limit", type=int, default=20, help="entries shown, oldest first (default 20)")
    p.set_defaults(func=cmd_dlq_peek)
    p = dlq.add_parser(
        "replay",
        help="move DLQ entries back to the stream (attempt reset to 0); undecodable ones are skipped, counted and stay",
    )
    _common(p)
    p.add_argument("--limit", type=int, default=100, help="entries replayed at most, oldest first (default 100)")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_dlq_replay)
    p = dlq.add_parser("remove", help="delete DLQ entries by id (the 'dlq id' column of peek)")
    _common(p)
    p.add_argument("ids", nargs="+", metavar="ID", help="DLQ entry ids, e.g. 1700000000000-0")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_dlq_remove)
    p = dlq.add_parser("purge", help="delete every DLQ entry, or those with --reason / --name")
    _common(p)
    p.add_argument("--reason", help="only entries with this reason (e.g. malformed, retries_exhausted)")
    p.add_argument("--name", help="only entries of this job name")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_dlq_purge)

    rep = sub.add_parser("repeatable", help="repeatable (cron / interval) specs").add_subparsers(
        dest="rep_cmd", required=True
    )
    p = rep.add_parser(
        "list",
        help="list specs one page at a time (active, then paused; pages follow a ZSCAN cursor, so they are not sorted)",
    )
    _common(p)
    p.add_argument("--limit", type=int, default=100, help="specs per page (default 100)")
    p.add_argument("--cursor", default=None, help="the cursor a previous page printed, for the next page")
    p.set_defaults(func=cmd_repeatable_list)
    for verb, helptext in (
        ("get", "show one spec"),
        ("pause", "stop a spec firing"),
        ("resume", "let a paused spec fire again"),
        ("remove", "delete a spec"),
    ):
        p = rep.add_parser(verb, help=helptext)
        _common(p)
        p.add_argument("key", help="spec key, e.g. 'report::every:60000'")
        p.set_defaults(func=cmd_repeatable_get if verb == "get" else _spec_action(verb))
    p = rep.add_parser(
        "import",
        help="bulk upsert specs from CSV or Parquet "
        "(columns: name, cron + tz or every_ms, data as JSON, key); every row "
        "is validated before anything is written",
    )
    _common(p)
    p.add_argument("file", help="a .csv or .parquet file")
    p.add_argument("--batch", type=int, default=1000, help="specs per upsert call (default 1000)")
    p.add_argument("--dry-run", action="store_true", help="validate every row, write nothing")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="import the valid rows and report the invalid ones (default: import nothing if any is invalid)",
    )
    p.set_defaults(func=cmd_repeatable_import)

    p = sub.add_parser("events", help="print the events stream")
    _common(p)
    p.add_argument("--from", dest="from_id", default="0-0", help="start id ('$' = only new events)")
    p.add_argument("--follow", "-f", action="store_true", help="keep waiting for new events")
    p.add_argument("--block-ms", type=int, default=5000, help="with --follow: how long one read waits (default 5000)")
    p.add_argument("--max-events", type=int, default=0, help="stop after N events (0 = no limit)")
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
