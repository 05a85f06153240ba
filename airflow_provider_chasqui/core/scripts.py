"""The Lua scripts, loaded once from ``lua/*.lua`` with their SHA1s, and the same scripts as
one Redis Functions library (``LIBRARY``).  Both are read on first use (PEP 562), not at import.

The wheel ships ``lua/`` as ``airflow_provider_chasqui/lua``; a source checkout reads the
top-level ``lua/`` folder.  Scripts are identified by file stem (``SCRIPTS["promote"]``);
``lua/include/`` holds helpers a script pulls in with a ``--#include <name>`` line.

The library is generated from the same files, never written by hand: each script body becomes
``local function f_<stem>(KEYS, ARGV) <body> end``, registered as ``<library>_<stem>`` (so the
body's ``KEYS``/``ARGV`` are FCALL's keys and args), with ``flags={'no-writes'}`` when every
``redis.call`` in it names a read-only command (those are called with FCALL_RO), and with
``flags={'allow-oom'}`` when it acknowledges stream entries (XACK/XACKDEL) or renews a lease
(XCLAIM): a flagged function is refused outright at ``maxmemory``, but the scripts that settle
work already in Redis, and keep the leases of jobs running, must run there, as they did as plain
EVALSHA scripts, or workers could not drain a full server
(``tests/security/test_functions.py::test_workers_drain_a_server_at_maxmemory``) and a job
running while it was full lost its lease, and ran a second time at once on another worker
(``::test_a_running_job_keeps_its_lease_at_maxmemory``).  The library
is named ``chasqui_<12 hex of the source's SHA1>``: another version of the package brings
another library, and both coexist on one server during a rolling deploy.  ``<library>_probe``
(no keys, no writes) answers the library's name; drivers call it once to learn whether the
library is loaded.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

__all__ = ["Script", "Library", "SCRIPTS", "LIBRARY", "LIBRARY_PREFIX", "lua_dir", "build_library", "read_bodies"]

LIBRARY_PREFIX = "chasqui_"

# Commands that write nothing: a script calling only these is registered ``no-writes``.
_READS = frozenset(
    {
        "GET",
        "MGET",
        "EXISTS",
        "TTL",
        "PTTL",
        "HGET",
        "HMGET",
        "HGETALL",
        "HEXISTS",
        "HLEN",
        "HSCAN",
        "ZCARD",
        "ZSCORE",
        "ZRANGE",
        "ZRANGEBYSCORE",
        "ZREVRANGE",
        "ZSCAN",
        "XLEN",
        "XRANGE",
        "XREVRANGE",
        "XPENDING",
        "XINFO",
        "TIME",
        "TYPE",
    }
)
_ACKS = re.compile(rb"'X(?:ACK|ACKDEL|CLAIM)'")  # settling and renewing: allowed at maxmemory
_CALL = re.compile(rb"redis\.p?call\(")
_LITERAL_CALL = re.compile(rb"redis\.p?call\(\s*'([A-Za-z]+)'")


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    body: bytes
    sha: str
    function: str = ""  # its function in LIBRARY (FCALL's first argument)
    fcall: str = "FCALL"  # "FCALL_RO" for a no-writes function


@dataclass(frozen=True, slots=True)
class Library:
    name: str
    source: bytes  # FUNCTION LOAD's argument
    probe: str  # a no-key function answering ``name``


def lua_dir() -> Path:
    packaged = resources.files("airflow_provider_chasqui") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parents[2] / "lua"
    if source.is_dir():
        return source
    raise FileNotFoundError("the lua/ scripts are missing from this installation")


def _read_only(body: bytes) -> bool:
    """Every ``redis.call`` names a command (no ``redis.call(unpack(t))``) that writes nothing."""
    named = _LITERAL_CALL.findall(body)
    return len(named) == len(_CALL.findall(body)) and all(n.upper().decode() in _READS for n in named)


def build_library(bodies: dict[str, bytes]) -> tuple[Library, dict[str, str]]:
    """The library wrapping ``bodies`` (stem -> script text) and each stem's FCALL command.

    The name is derived from the source written with a placeholder, so the same scripts give
    the same name on every machine and any change to a script (or to this wrapping) a new one.
    """
    parts, registers, fcalls = [], [], {}
    for stem, body in sorted(bodies.items()):
        if not re.fullmatch(r"[a-z][a-z0-9_]*", stem) or stem == "probe":
            raise ValueError(f"lua/{stem}.lua: a script name must be lowercase letters, digits and _, not 'probe'")
        ro = _read_only(body)
        fcalls[stem] = "FCALL_RO" if ro else "FCALL"
        parts.append(b"local function f_%b(KEYS, ARGV)\n%b\nend\n" % (stem.encode(), body.rstrip(b"\n")))
        flags = b", flags={'no-writes'}" if ro else b", flags={'allow-oom'}" if _ACKS.search(body) else b""
        registers.append(
            b"redis.register_function{function_name='@LIB@_%b', callback=f_%b%b}\n"
            % (stem.encode(), stem.encode(), flags)
        )
    registers.append(
        b"redis.register_function{function_name='@LIB@_probe', callback=function() return '@LIB@' end, "
        b"flags={'no-writes'}}\n"
    )
    template = b"#!lua name=@LIB@\n" + b"".join(parts) + b"".join(registers)
    name = LIBRARY_PREFIX + hashlib.sha1(template).hexdigest()[:12]
    return Library(name, template.replace(b"@LIB@", name.encode()), f"{name}_probe"), fcalls


_INCLUDE = re.compile(rb"^--#include ([a-z][a-z0-9_]*)\n", re.MULTILINE)


def read_bodies(folder: Path | None = None) -> dict[str, bytes]:
    """Each ``lua/*.lua`` script's text (stem -> bytes), with every ``--#include <name>`` line
    replaced by ``lua/include/<name>.lua``: helpers two scripts need (acking and deleting a batch)
    are written once, and each script still runs alone (``EVALSHA``) or in the library."""
    folder = folder or lua_dir()

    def fragment(m: re.Match[bytes]) -> bytes:
        path = folder / "include" / f"{m.group(1).decode()}.lua"
        if not path.is_file():
            raise FileNotFoundError(f"--#include {m.group(1).decode()}: {path} is missing")
        return path.read_bytes().rstrip(b"\n") + b"\n"

    return {path.stem: _INCLUDE.sub(fragment, path.read_bytes()) for path in sorted(folder.glob("*.lua"))}


def _load() -> tuple[dict[str, Script], Library]:
    bodies = read_bodies()
    library, fcalls = build_library(bodies)
    scripts = {
        stem: Script(stem, body, hashlib.sha1(body).hexdigest(), f"{library.name}_{stem}", fcalls[stem])
        for stem, body in bodies.items()
    }
    return scripts, library


if TYPE_CHECKING:
    SCRIPTS: dict[str, Script]
    LIBRARY: Library


def __getattr__(name: str) -> Any:
    """``SCRIPTS`` and ``LIBRARY``, read from disk the first time either is used."""
    if name in ("SCRIPTS", "LIBRARY"):
        scripts, library = _load()
        globals().update(SCRIPTS=scripts, LIBRARY=library)  # later lookups are plain reads
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
