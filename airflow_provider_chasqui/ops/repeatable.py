"""``chasqui repeatable list | get | pause | resume | remove | import``: the cron and
interval specs of a queue.

``list`` pages with a ZSCAN cursor and shows a corrupt spec as such (its key escaped, the
reason) instead of failing the page; ``import`` reads CSV or Parquet, validates every row as
the upsert will encode it before writing anything (row numbers in every error), then writes
in batches.  Exit codes and errors as in ``commands.py``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TextIO

from ..cli_common import positive_int
from ..core.codec import now_ms
from ..errors import ChasquiError, ConfigError
from .commands import EXIT_OK, NotFound, add_common, emit, iso_ms, open_queue, table

__all__ = ["register"]


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
    items, cursor = open_queue(args).list_repeatable(cursor=args.cursor, count=args.limit)
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
    meta = open_queue(args).get_repeatable_job(args.key)
    if meta is None:
        raise NotFound(f"no repeatable spec with key {args.key!r} on queue {args.queue!r} (see `repeatable list`)")
    d = _meta_dict(meta)
    emit(args, d, lambda out: table(list(d.items()), ("field", "value"), out))
    return EXIT_OK


def _spec_action(verb: str) -> Callable[[argparse.Namespace], int]:
    method = {"pause": "pause_repeatable", "resume": "resume_repeatable", "remove": "remove_repeatable_by_key"}[verb]

    def run(args: argparse.Namespace) -> int:
        ok = getattr(open_queue(args), method)(args.key)
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
        every = row["every_ms"]
        if isinstance(every, str):  # a CSV cell: int() would say "invalid literal for int() with base 10"
            if not every.strip().isascii() or not every.strip().isdigit():
                raise ConfigError(f"row {line}: 'every_ms' must be a whole number of milliseconds, got {every!r}")
            every = int(every)
        elif isinstance(every, float) and every.is_integer():  # a Parquet float column (pandas, with nulls)
            every = int(every)
        pattern = RepeatPattern.every(every)
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
    q = open_queue(args)
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


def register(sub: Any) -> None:
    """Add ``repeatable`` and its subcommands to the ``chasqui`` parser's subparsers."""
    rep = sub.add_parser("repeatable", help="repeatable (cron / interval) specs").add_subparsers(
        dest="rep_cmd", required=True
    )
    p = rep.add_parser(
        "list",
        help="list specs one page at a time (active, then paused; pages follow a ZSCAN cursor, so they are not sorted)",
    )
    add_common(p)
    p.add_argument("--limit", type=positive_int, default=100, help="specs per page (default 100)")
    p.add_argument("--cursor", default=None, help="the cursor a previous page printed, for the next page")
    p.set_defaults(func=cmd_repeatable_list)
    for verb, helptext in (
        ("get", "show one spec"),
        ("pause", "stop a spec firing"),
        ("resume", "let a paused spec fire again"),
        ("remove", "delete a spec"),
    ):
        p = rep.add_parser(verb, help=helptext)
        add_common(p)
        p.add_argument("key", help="spec key, e.g. 'report::every:60000'")
        p.set_defaults(func=cmd_repeatable_get if verb == "get" else _spec_action(verb))
    p = rep.add_parser(
        "import",
        help="bulk upsert specs from CSV or Parquet "
        "(columns: name, cron + tz or every_ms, data as JSON, key); every row "
        "is validated before anything is written",
    )
    add_common(p)
    p.add_argument("file", help="a .csv or .parquet file")
    p.add_argument("--batch", type=positive_int, default=1000, help="specs per upsert call (default 1000)")
    p.add_argument("--dry-run", action="store_true", help="validate every row, write nothing")
    p.add_argument(
        "--skip-invalid",
        action="store_true",
        help="import the valid rows and report the invalid ones (default: import nothing if any is invalid)",
    )
    p.set_defaults(func=cmd_repeatable_import)
