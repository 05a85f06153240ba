"""``chasqui functions install | status``: the Redis Functions library, for an admin user.

Workers and producers run their scripts as FCALL of one library (``core/scripts.py``) when it is
loaded, so their own Redis user needs no script rights at all (SECURITY.md).  An admin loads
it once per server and package version with ``install``; on a cluster, on every master.
``status`` says whether this version's library is there and which other chasqui libraries
(other package versions) are loaded beside it.  Exit codes as the other commands: 0 ok,
1 failed (e.g. NOPERM), 3 Redis unreachable, 4 not loaded (``status``).
"""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from redis.cluster import RedisCluster

from ..cli_common import DEFAULT_URL, resolve_url
from ..core.calls import str_reply
from ..core.features import load_call
from ..core.scripts import LIBRARY, LIBRARY_PREFIX
from ..drivers_common import already_loaded
from ..errors import ChasquiError
from ..sync import raw_client
from .commands import EXIT_NOT_FOUND, EXIT_OK, emit

__all__ = ["install", "register", "status"]


def _nodes(client: Any) -> list[tuple[str, dict[str, Any]]]:
    """(name, execute_command kwargs) of every server that must hold the library."""
    if isinstance(client, RedisCluster):
        return [(n.name, {"target_nodes": n}) for n in client.get_primaries()]
    kw = client.connection_pool.connection_kwargs
    return [(f"{kw.get('host', kw.get('path', '?'))}:{kw.get('port', '')}".rstrip(":"), {})]


def _libraries(client: Any, kw: dict[str, Any]) -> dict[str, bytes]:
    """The chasqui libraries on one node: name -> code."""
    out = {}
    for lib in client.execute_command("FUNCTION", "LIST", "LIBRARYNAME", f"{LIBRARY_PREFIX}*", "WITHCODE", **kw):
        fields = dict(zip(lib[::2], lib[1::2]))
        name = str_reply(fields[b"library_name"])
        if name.startswith(LIBRARY_PREFIX):  # the pattern is a glob: chasqui_ exactly
            out[name] = bytes(fields.get(b"library_code", b""))
    return out


def install(url: str, replace: bool = False) -> list[dict[str, Any]]:
    """Load the library on every node: per node ``loaded``, ``replaced`` or ``present`` (the
    same code was there); raises ChasquiError when a node holds other code under its name."""
    client = raw_client(url)
    try:
        rows = []
        for name, kw in _nodes(client):
            try:
                client.execute_command(*load_call(replace).args, **kw)
                outcome = "replaced" if replace else "loaded"
            except Exception as exc:  # only "already exists" is an answer here
                if not already_loaded(exc):
                    raise
                if _libraries(client, kw).get(LIBRARY.name) != LIBRARY.source:
                    raise ChasquiError(
                        f"{name} holds a library named {LIBRARY.name} with other code; "
                        "run `chasqui functions install --replace`"
                    ) from exc
                outcome = "present"
            rows.append({"node": name, "library": LIBRARY.name, "outcome": outcome})
        return rows
    finally:
        client.close()


def status(url: str) -> list[dict[str, Any]]:
    """Per node: whether this version's library is loaded with this code, and the others."""
    client = raw_client(url)
    try:
        rows = []
        for name, kw in _nodes(client):
            libs = _libraries(client, kw)
            code = libs.pop(LIBRARY.name, None)
            rows.append(
                {
                    "node": name,
                    "library": LIBRARY.name,
                    "loaded": code is not None,
                    "code_matches": code == LIBRARY.source,
                    "other_versions": sorted(libs),
                }
            )
        return rows
    finally:
        client.close()


def _url(args: argparse.Namespace) -> str:
    url: str
    url, _ = resolve_url(args.redis_url, None, DEFAULT_URL)
    args.resolved_url = url
    return url


def cmd_install(args: argparse.Namespace) -> int:
    rows = install(_url(args), args.replace)

    def human(out: TextIO) -> None:
        for r in rows:
            out.write(f"{r['node']}: {r['library']} {r['outcome']}\n")

    emit(args, rows, human)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    rows = status(_url(args))

    def human(out: TextIO) -> None:
        for r in rows:
            state = (
                ("loaded" if r["code_matches"] else "loaded with OTHER code (install --replace)")
                if r["loaded"]
                else "not loaded (scripts run as EVALSHA where the user may)"
            )
            others = ", ".join(r["other_versions"]) or "none"
            out.write(f"{r['node']}: {r['library']} {state}; other versions: {others}\n")

    emit(args, rows, human)
    return EXIT_OK if all(r["loaded"] and r["code_matches"] for r in rows) else EXIT_NOT_FOUND


def register(sub: Any) -> None:
    fn = sub.add_parser("functions", help="the Redis Functions library the scripts run from (admin)")
    cmds = fn.add_subparsers(dest="functions_cmd", required=True)
    for verb, func, helptext in (
        (
            "install",
            cmd_install,
            f"load library {LIBRARY.name} (FUNCTION LOAD) on the server, on every "
            "master of a cluster; needs an admin user",
        ),
        ("status", cmd_status, "whether this version's library is loaded, and which other versions are"),
    ):
        p = cmds.add_parser(verb, help=helptext)
        p.add_argument(
            "--redis-url",
            default=None,
            help=f"Redis URL of an admin user (default: $CHASQUI_REDIS_URL, else {DEFAULT_URL})",
        )
        p.add_argument("--json", action="store_true", help="machine-readable output")
        if verb == "install":
            p.add_argument("--replace", action="store_true", help="replace a library of the same name")
        p.set_defaults(func=func)
