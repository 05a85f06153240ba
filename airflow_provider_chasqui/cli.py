"""``chasqui``: one console script, a table of subcommands.

``worker`` starts a worker (``worker/cli.py``); the operator's tools live in ``ops/``, one
module per command group, each with a ``register(subparsers)`` listed in :data:`COMMANDS`
(add a module there to add a command group).  Importing this module loads neither Airflow nor
PySpark.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main", "build_parser", "COMMANDS"]

#: Modules (under ``airflow_provider_chasqui``) whose ``register(sub)`` adds subcommands, in help order.
COMMANDS: tuple[str, ...] = (
    ".ops.queues",  # queues, queue drain | obliterate
    ".ops.commands",  # inspect, workers, watch, events, functions
    ".ops.dlq",  # dlq peek | replay | remove | purge
    ".ops.repeatable",  # repeatable list | get | pause | resume | remove | import
    ".ops.jobs",  # job show
    ".ops.standalone",  # scheduler, promoter
    ".ops.completion",  # completion bash
    ".dashboard.cli",  # dashboard (the web UI; FastAPI is imported only when it runs)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chasqui",
        description="ChasquiMQ-compatible job queue: run workers and inspect queues.",
        epilog="Redis: --redis-url, else --conn-id (an Airflow connection), else $CHASQUI_REDIS_URL, else "
        "redis://127.0.0.1:6379.  Every command takes --json.  Exit codes: 0 ok, 1 failed, 2 bad usage, "
        "3 Redis unreachable, 4 not found",
    )
    from .worker.cli import package_version

    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {package_version()}",
        help="print the package version and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("worker", help="run a worker (see `chasqui worker --help`)", add_help=False)
    for name in COMMANDS:
        importlib.import_module(name, __package__).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":
        from .worker.cli import main as worker_main

        return worker_main(argv[1:])
    from .ops.commands import run

    args = build_parser().parse_args(argv)
    return run(args.func, args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
