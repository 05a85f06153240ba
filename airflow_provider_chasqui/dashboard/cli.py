"""``chasqui dashboard``: the web dashboard without Airflow (the ``dashboard`` extra).

Bound to 127.0.0.1 by default.  Any other address needs a token (``--token`` or
``$CHASQUI_DASHBOARD_TOKEN``, the latter keeps it out of argv) or basic auth
(``--basic-auth user:password`` or ``$CHASQUI_DASHBOARD_BASIC_AUTH``): a dashboard that can
replay and purge is not left open on a network.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
from typing import Any

from ..cli_common import tcp_port
from ..errors import ConfigError

__all__ = ["register", "cmd_dashboard", "check_bind", "served_hosts"]

DEFAULT_PORT = 8377
LOOPBACK_NAMES = {"localhost", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, basic_auth: str | None) -> None:
    """Refuse a non-loopback address without credentials; check the credentials' shape."""
    if basic_auth is not None and (
        ":" not in basic_auth or not basic_auth.split(":", 1)[0] or not basic_auth.split(":", 1)[1]
    ):
        raise ConfigError("--basic-auth takes user:password (both non-empty)")
    if token is not None and len(token) < 16:
        raise ConfigError(
            "--token must be at least 16 characters (e.g. `python -c 'import secrets; print(secrets.token_urlsafe())'`)"
        )
    if not is_loopback(host) and token is None and basic_auth is None:
        raise ConfigError(
            f"refusing to serve the dashboard on {host}: it can replay, purge and pause, so an "
            "address other than loopback needs --token (or $CHASQUI_DASHBOARD_TOKEN) or "
            "--basic-auth user:password (or $CHASQUI_DASHBOARD_BASIC_AUTH)"
        )


def served_hosts(bind: str, extra: list[str] | None) -> list[str] | None:
    """The ``Host`` names the server answers: on a loopback bind its loopback names plus
    ``--allowed-host`` (any other name is a DNS-rebinding page); elsewhere, the names given, or
    any (the token or basic auth guards it)."""
    names = [h for h in (extra or ()) if h]
    if is_loopback(bind):
        return [*LOOPBACK_NAMES, "127.0.0.1", "::1", bind, *names]
    return names or None


def cmd_dashboard(args: argparse.Namespace) -> int:
    from ..cli_common import DEFAULT_URL, resolve_url

    token = args.token or os.environ.get("CHASQUI_DASHBOARD_TOKEN") or None
    basic = args.basic_auth or os.environ.get("CHASQUI_DASHBOARD_BASIC_AUTH") or None
    check_bind(args.host, token, basic)
    try:
        import uvicorn

        from .app import create_app
        from .auth import standalone_access
        from .data import StaticSources
    except ImportError as exc:
        raise ConfigError(
            f"the dashboard needs FastAPI and uvicorn ({exc}): pip install 'airflow-provider-chasqui[dashboard]'"
        ) from exc
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.resolved_url, _ = resolve_url(args.redis_url, args.conn_id, DEFAULT_URL)
    sources = StaticSources({args.conn_id or "default": args.resolved_url}, queues=args.queue or (), group=args.group)
    app = create_app(
        sources,
        access=standalone_access(token, basic),
        login_token=token is not None,
        allowed_hosts=served_hosts(args.host, args.allowed_host),
    )
    print(
        f"chasqui dashboard on http://{args.host}:{args.port}/ "
        f"({'token' if token else 'basic auth' if basic else 'no auth: loopback only'})",
        flush=True,
    )
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(), access_log=False)
    return 0


def register(sub: Any) -> None:
    """Add ``dashboard`` to the ``chasqui`` command table (called from ``cli.py``)."""
    p = sub.add_parser("dashboard", help="serve the web dashboard (queues, jobs, DLQ, schedules, workers)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--redis-url", help="Redis URL (default: $CHASQUI_REDIS_URL, else redis://127.0.0.1:6379)")
    where.add_argument("--conn-id", help="an Airflow 'chasqui' connection id instead of a URL (imports Airflow)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind (default 127.0.0.1; any other needs --token or --basic-auth)",
    )
    p.add_argument("--port", type=tcp_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument(
        "--allowed-host",
        action="append",
        metavar="NAME",
        help="also answer requests for this Host name (e.g. a proxy's); a loopback bind answers only "
        "its loopback names otherwise (DNS rebinding)",
    )
    p.add_argument("--token", help="require this bearer token (better: $CHASQUI_DASHBOARD_TOKEN, not in argv)")
    p.add_argument(
        "--basic-auth",
        metavar="USER:PASSWORD",
        help="require HTTP basic auth (better: $CHASQUI_DASHBOARD_BASIC_AUTH, not in argv)",
    )
    p.add_argument("--queue", "-q", action="append", help="always list this queue (the scan finds the others)")
    p.add_argument("--group", default="default", help="consumer group the pending/waiting counts are for")
    p.add_argument(
        "--log-level",
        type=str.upper,
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="log level of the server and its audit lines (default INFO)",
    )
    p.set_defaults(func=cmd_dashboard)
