"""The operator's commands: ``chasqui inspect | dlq | repeatable | events | watch``.

Tables for people, ``--json`` for scripts.  Exit codes: 0 ok, 1 failed, 2 bad usage,
3 Redis unreachable, 4 not found.  Errors name the problem and the fix.  Blocking code on
``SyncQueue``/``SyncDriver``: no event loop, no Airflow import.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Sequence, TextIO

from ..core.calls import command, str_reply
from ..core.codec import now_ms
from ..core.inspect import snapshot
from ..core.keys import QueueKeys
from ..core.producer import parse_fields
from ..core.urls import WAIT_BLOCK_MS
from ..errors import ChasquiConnectionError, ChasquiError, ConfigError
from ..sync._driver import translate_errors
from ..sync.queue import SyncQueue

__all__ = ["register", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE", "EXIT_UNREACHABLE", "EXIT_NOT_FOUND"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_NOT_FOUND = 0, 1, 2, 3, 4
DEFAULT_URL = "redis://127.0.0.1:6379"


class NotFound(ChasquiError):
    """A named spec or entry does not exist (exit code 4)."""


# ---- output helpers ------------------------------------------------------------------------
def table(rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO) -> None:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, r in enumerate(cells):
        out.write("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n")
        if n == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def iso_ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")


def emit(args: argparse.Namespace, data: Any, human: Callable[[TextIO], None]) -> None:
    if args.json:
        json.dump(data, sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        human(sys.stdout)


def _queue(args: argparse.Namespace) -> SyncQueue:
    return SyncQueue(args.queue, redis_url=args.redis_url)


# ---- inspect / watch ----------------------------------------------------------------------
def _snapshot(q: SyncQueue, group: str) -> Any:
    return q.driver.run(snapshot(q.name, group=group, now_ms=now_ms()))


def _print_snapshot(s: Any, out: TextIO, prev: Any = None) -> None:
    def delta(field: str) -> str:
        return "" if prev is None else f" ({getattr(s, field) - getattr(prev, field):+d})"

    lag = "-" if s.oldest_delayed_lag_ms is None else f"{s.oldest_delayed_lag_ms} ms"
    rows = [
        ("stream", f"{s.stream}{delta('stream')}"),
        ("pending", s.pending if s.group_exists else "0 (group not created)"),
        ("delayed", f"{s.delayed} (oldest lag {lag})"),
        ("dlq", f"{s.dlq}{delta('dlq')}"),
        ("repeatable specs", f"{s.specs} active, {s.paused_specs} paused"),
        ("promoter leader", s.promoter_leader),
        ("scheduler leader", s.scheduler_leader),
    ]
    out.write(f"queue {s.queue}\n")
    table(rows, ("what", "value"), out)
    if s.consumers:
        out.write("\n")
        table([(c.name, c.pending, f"{c.idle_ms} ms") for c in s.consumers], ("consumer", "pending", "idle"), out)
    if s.next_fires:
        out.write("\n")
        table([(k, iso_ms(ms)) for k, ms in s.next_fires], ("next fires", "at (UTC)"), out)


def cmd_inspect(args: argparse.Namespace) -> int:
    s = _snapshot(_queue(args), args.group)
    emit(args, s.to_dict(), lambda out: _print_snapshot(s, out))
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
def cmd_dlq_peek(args: argparse.Namespace) -> int:
    rows = _queue(args).peek_dlq(args.limit)
    data = [{**r, "payload_bytes": len(r["payload"]), "payload": None} for r in rows]

    def human(out: TextIO) -> None:
        table([(r["dlq_id"], r["source_id"], r["name"] or "-", r["reason"], (r["detail"] or "")[:60],
                r["payload_bytes"]) for r in data], ("dlq id", "source id", "name", "reason", "detail", "bytes"), out)
        counts: dict[str, int] = {}
        for r in data:
            counts[r["reason"]] = counts.get(r["reason"], 0) + 1
        out.write("\n" + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + "\n" if counts else "DLQ is empty\n")

    emit(args, data, human)
    return EXIT_OK


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError("refusing to replay without confirmation: pass --yes when not on a terminal")
        if input(f"replay up to {args.limit} DLQ entries of {args.queue}? [y/N] ").strip().lower() != "y":
            print("cancelled")
            return EXIT_FAILED
    n = _queue(args).replay_dlq(args.limit)
    emit(args, {"replayed": n, "limit": args.limit}, lambda out: out.write(f"replayed {n} of {args.limit} entries\n"))
    return EXIT_OK


# ---- repeatable ---------------------------------------------------------------------------
def _meta_dict(m: Any) -> dict[str, Any]:
    p = m.pattern
    return {
        "key": m.key, "job_name": m.job_name, "kind": p.kind,
        "pattern": p.expression if p.kind == "cron" else f"every {p.interval_ms}ms",
        "tz": (p.tz or "UTC") if p.kind == "cron" else None, "next_fire_ms": m.next_fire_ms,
        "next_fire": iso_ms(m.next_fire_ms), "limit": m.limit,
        "paused": getattr(m, "paused", False), "fired": getattr(m, "fired", 0), "skipped": getattr(m, "skipped", 0),
    }


def cmd_repeatable_list(args: argparse.Namespace) -> int:
    items, cursor = _queue(args).list_repeatable(cursor=args.cursor, count=args.limit)
    data = {"items": [_meta_dict(m) for m in items], "next_cursor": cursor}

    def human(out: TextIO) -> None:
        table([(d["key"], d["job_name"], d["pattern"], d["tz"], d["next_fire"], d["limit"],
                "paused" if d["paused"] else "active", d["fired"]) for d in data["items"]],
              ("key", "job", "pattern", "tz", "next fire (UTC)", "limit", "state", "fired"), out)
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
    spec = {"name": str(name), "data": data, "repeat": pattern}
    if row.get("key"):
        spec["key"] = str(row["key"])
    return spec


def cmd_repeatable_import(args: argparse.Namespace) -> int:
    q = _queue(args)
    total, batch = 0, []
    started = time.monotonic()
    for line, row in enumerate(_read_rows(args.file), start=2):
        batch.append(_row_to_spec(row, line))
        if len(batch) >= args.batch:
            total += len(q.upsert_repeatable_bulk(batch))
            batch = []
            _progress(total, started)
    if batch:
        total += len(q.upsert_repeatable_bulk(batch))
    _progress(total, started, final=True)
    emit(args, {"imported": total}, lambda out: out.write(f"imported {total} specs into {args.queue}\n"))
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
    return f"{iso_ms(ts)} {str_reply(entry_id)} {kind} id={jid} name={name}" + (f" {extra}" if extra else "")


def cmd_events(args: argparse.Namespace) -> int:
    q = _queue(args)
    key = QueueKeys.for_queue(args.queue).events
    cursor = args.from_id
    if cursor == "$":
        last = q.driver.call(command("XREVRANGE", key, "+", "-", "COUNT", 1))
        cursor = str_reply(last[0][0]) if last else "0-0"
    shown = 0
    try:
        while True:
            block = ("BLOCK", min(args.block_ms, WAIT_BLOCK_MS)) if args.follow else ()  # the socket timeout's
            rows = q.driver.call(command("XREAD", "COUNT", 100, *block, "STREAMS", key, cursor))
            for _s, entries in rows or []:
                for entry_id, flat in entries:
                    cursor = str_reply(entry_id)
                    if args.json:
                        f = {k: str_reply(v) for k, v in parse_fields(flat).items()}
                        print(json.dumps({"event_id": cursor, **f}), flush=True)
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
    p.add_argument("--redis-url", default=DEFAULT_URL, help=f"Redis URL (default {DEFAULT_URL})")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def register(sub: Any) -> None:
    """Add the operator subcommands to the ``chasqui`` parser's subparsers."""
    p = sub.add_parser("inspect", help="stream, pending, delayed, DLQ, specs, leaders of a queue")
    _common(p)
    p.add_argument("--group", default="default")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("watch", help="a live view of `inspect` that refreshes in place")
    _common(p)
    p.add_argument("--group", default="default")
    p.add_argument("--interval-ms", type=int, default=1000)
    p.add_argument("--iterations", type=int, default=None, help="stop after N refreshes")
    p.set_defaults(func=cmd_watch)

    dlq = sub.add_parser("dlq", help="dead-letter queue").add_subparsers(dest="dlq_cmd", required=True)
    p = dlq.add_parser("peek", help="show DLQ entries (payloads not decoded)")
    _common(p)
    p.add_argument("--limit", type=int, default=20)
    p.set_defaults(func=cmd_dlq_peek)
    p = dlq.add_parser("replay", help="move DLQ entries back to the stream (attempt reset to 0)")
    _common(p)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_dlq_replay)

    rep = sub.add_parser("repeatable", help="repeatable (cron / interval) specs").add_subparsers(
        dest="rep_cmd", required=True)
    p = rep.add_parser("list", help="list specs one page at a time (active, then paused; pages follow a "
                                    "ZSCAN cursor, so they are not sorted)")
    _common(p)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--cursor", default=None)
    p.set_defaults(func=cmd_repeatable_list)
    for verb, helptext in (("get", "show one spec"), ("pause", "stop a spec firing"),
                           ("resume", "let a paused spec fire again"), ("remove", "delete a spec")):
        p = rep.add_parser(verb, help=helptext)
        _common(p)
        p.add_argument("key", help="spec key, e.g. 'report::every:60000'")
        p.set_defaults(func=cmd_repeatable_get if verb == "get" else _spec_action(verb))
    p = rep.add_parser("import", help="bulk upsert specs from CSV or Parquet "
                                      "(columns: name, cron + tz or every_ms, data as JSON, key)")
    _common(p)
    p.add_argument("file")
    p.add_argument("--batch", type=int, default=1000)
    p.set_defaults(func=cmd_repeatable_import)

    p = sub.add_parser("events", help="print the events stream")
    _common(p)
    p.add_argument("--from", dest="from_id", default="0-0", help="start id ('$' = only new events)")
    p.add_argument("--follow", "-f", action="store_true", help="keep waiting for new events")
    p.add_argument("--block-ms", type=int, default=5000)
    p.add_argument("--max-events", type=int, default=0, help="stop after N events (0 = no limit)")
    p.set_defaults(func=cmd_events)


def run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a subcommand, mapping errors to exit codes with a one-line message on stderr."""
    try:
        with translate_errors():
            return func(args)
    except NotFound as exc:
        print(f"chasqui: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except ChasquiConnectionError as exc:
        print(f"chasqui: {exc} -- is Redis running at {getattr(args, 'redis_url', '?')}? "
              "Pass --redis-url to point elsewhere.", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ConfigError as exc:
        print(f"chasqui: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ChasquiError as exc:
        print(f"chasqui: {exc}", file=sys.stderr)
        return EXIT_FAILED
