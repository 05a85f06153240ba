"""``chasqui scheduler`` and ``chasqui promoter``: the leader-locked loops on their own, for
producer-only deployments (workers run both embedded).

``chasqui scheduler --queue Q [--promoter]`` fires repeatable specs (and promotes delayed jobs
with ``--promoter``); ``chasqui promoter --queue Q`` only promotes.  Several processes may run:
one holds each queue's lock, the others take over within the lock's TTL.  SIGTERM or SIGINT
stops the loops, releases the locks and exits 0; ``--json`` prints the totals on exit.
(``python -m airflow_provider_chasqui.engine.scheduler`` still works, with a runpy warning.)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from ..cli_common import DEFAULT_URL, LOG_LEVELS, configure_logging, resolve_url
from ..cli_common import positive_int as _positive
from ..core.sharding import shard_queue_names
from ..errors import ConfigError
from .commands import add_target

__all__ = ["register", "run", "add_options"]


def add_options(p: argparse.ArgumentParser, role: str) -> None:
    p.add_argument(
        "--queue",
        "-q",
        action="append",
        default=None,
        help="queue to serve (repeat for several; default with --conn-id: the connection's default_queue)",
    )
    p.add_argument(
        "--shards", type=_positive, default=None, help="serve the shards <queue>.0 .. <queue>.N-1 of each --queue"
    )
    if role == "scheduler":
        p.add_argument("--promoter", action="store_true", help="also promote due delayed jobs")
        p.add_argument(
            "--tick-ms",
            type=_positive,
            default=1000,
            help="longest sleep between ticks in ms (default 1000; the next fire wakes it earlier)",
        )
    p.add_argument("--poll-ms", type=_positive, default=100, help="promoter poll interval in ms (default 100)")
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=LOG_LEVELS,
        default="INFO",
        help="level of this package's loggers (default INFO)",
    )
    add_target(p)


def _queues(args: argparse.Namespace, default_queue: str | None) -> list[str]:
    queues = list(args.queue or ([default_queue] if default_queue else []))
    if not queues:
        raise ConfigError("no queue: pass --queue (or a --conn-id whose connection sets default_queue)")
    if args.shards is None:
        return queues
    return [s for q in queues for s in shard_queue_names(q, args.shards)]


def run(args: argparse.Namespace) -> int:
    """Run the loops of ``args.role`` until SIGTERM/SIGINT; 0 after a clean stop."""
    from ..engine.scheduler import run_standalone  # the engine only once arguments are valid

    configure_logging(args.log_level)
    args.resolved_url, default_queue = resolve_url(args.redis_url, args.conn_id, DEFAULT_URL)
    if args.conn_id:
        configure_logging(args.log_level)  # importing Airflow installed its own logging setup
    queues = _queues(args, default_queue)
    scheduler = args.role == "scheduler"
    promoter = not scheduler or args.promoter
    loops: list[Any] = []

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        loops.extend(
            await run_standalone(
                queues,
                args.resolved_url,
                scheduler=scheduler,
                promoter=promoter,
                tick_ms=getattr(args, "tick_ms", 1000),
                poll_ms=args.poll_ms,
                stop=stop,
            )
        )

    asyncio.run(main())
    totals = {
        "queues": queues,
        "fired": sum(getattr(lp, "fired_total", 0) for lp in loops),
        "promoted": sum(getattr(lp, "promoted_total", 0) for lp in loops),
    }
    logging.getLogger(__name__).info("stopped: %d fired, %d promoted", totals["fired"], totals["promoted"])
    if args.json:
        print(json.dumps(totals), flush=True)
    return 0


def register(sub: Any) -> None:
    for role, helptext in (
        ("scheduler", "run the repeatable-job scheduler (with --promoter, the promoter too) without a worker"),
        ("promoter", "run the delayed-job promoter without a worker"),
    ):
        p = sub.add_parser(role, help=helptext, description=helptext + "; SIGTERM stops it cleanly (exit 0)")
        add_options(p, role)
        p.set_defaults(func=run, role=role)


def main(argv: Sequence[str] | None = None) -> int:
    """The old ``python -m airflow_provider_chasqui.engine.scheduler`` arguments, kept working."""
    parser = argparse.ArgumentParser(
        prog="python -m airflow_provider_chasqui.engine.scheduler",
        description="Deprecated: use `chasqui scheduler` / `chasqui promoter`.",
    )
    add_options(parser, "scheduler")
    parser.add_argument("--no-scheduler", action="store_true", help="promoter only (`chasqui promoter`)")
    args = parser.parse_args(argv)
    if args.no_scheduler and not args.promoter:
        parser.error("--no-scheduler needs --promoter")
    args.role = "promoter" if args.no_scheduler else "scheduler"
    print(
        f"note: `python -m airflow_provider_chasqui.engine.scheduler` is deprecated; run `chasqui {args.role}`",
        file=sys.stderr,
    )
    from .commands import run as run_command

    return run_command(run, args)
