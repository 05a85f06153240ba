"""``chasqui dlq peek | replay | remove | purge``: the dead-letter stream of a queue.

Payloads are never decoded for the table (their size is shown); replay moves entries back to
the stream with the attempt reset and leaves undecodable ones where they are (counted);
every destructive command asks first (``--yes`` for scripts).  Exit codes and errors as in
``commands.py``.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from ..cli_common import positive_int
from ..core.calls import command
from .commands import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, add_common, confirm, emit, open_queue, table

__all__ = ["register"]

_HANDLER_PREFIX = "handler: Python handler raised: "  # ChasquiMQ's reason prefix; the table shows the error


def _last_line(text: str | None) -> str:
    """A traceback's last line (``ValueError: boom``): what a one-line table can show of it."""
    return (text or "").rstrip().rpartition("\n")[2]


def cmd_dlq_peek(args: argparse.Namespace) -> int:
    rows = open_queue(args).peek_dlq(args.limit)
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
    report = open_queue(args).replay_dlq_report(args.limit)
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
    q = open_queue(args)
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
    q = open_queue(args)
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


def register(sub: Any) -> None:
    """Add ``dlq`` and its subcommands to the ``chasqui`` parser's subparsers."""
    dlq = sub.add_parser("dlq", help="dead-letter queue").add_subparsers(dest="dlq_cmd", required=True)
    p = dlq.add_parser("peek", help="show DLQ entries (payloads not decoded)")
    add_common(p)
    p.add_argument("--limit", type=positive_int, default=20, help="entries shown, oldest first (default 20)")
    p.set_defaults(func=cmd_dlq_peek)
    p = dlq.add_parser(
        "replay",
        help="move DLQ entries back to the stream (attempt reset to 0); undecodable ones are skipped, counted and stay",
    )
    add_common(p)
    p.add_argument(
        "--limit", type=positive_int, default=100, help="entries replayed at most, oldest first (default 100)"
    )
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_dlq_replay)
    p = dlq.add_parser("remove", help="delete DLQ entries by id (the 'dlq id' column of peek)")
    add_common(p)
    p.add_argument("ids", nargs="+", metavar="ID", help="DLQ entry ids, e.g. 1700000000000-0")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_dlq_remove)
    p = dlq.add_parser("purge", help="delete every DLQ entry, or those with --reason / --name")
    add_common(p)
    p.add_argument("--reason", help="only entries with this reason (e.g. malformed, retries_exhausted)")
    p.add_argument("--name", help="only entries of this job name")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    p.set_defaults(func=cmd_dlq_purge)
