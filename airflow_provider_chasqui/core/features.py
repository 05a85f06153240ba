"""Which Redis 8 fast paths a server offers, decided once per connection.

Only XACKDEL (Redis 8.2+) is used as a fast path: ChasquiMQ's other Redis 8 commands
(XREADGROUP CLAIM 8.4, XADD IDMP 8.6) cannot be tested on any server available to this
project, so their Redis 7.0 equivalents (XPENDING + XCLAIM recovery, a Lua marker) are the
only paths.  ``CHASQUI_FAST_PATHS=0`` (or ``fast_paths=False``) forces the 7.0 path.

Scripts run as FCALL of the Redis Functions library (``core/scripts.py``'s ``LIBRARY``) when it
is loaded, else as EVALSHA (with SCRIPT LOAD on NOSCRIPT).  A driver learns which once, with
``probe_call``, before its first script call; ``CHASQUI_FUNCTIONS`` chooses the policy
(``functions_mode``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from . import scripts as _scripts
from .calls import Call, command, packed_command, resp_bulk

__all__ = [
    "Features",
    "detect_call",
    "parse_features",
    "fast_paths_default",
    "COMPAT",
    "functions_mode",
    "probe_call",
    "probe_found",
    "load_call",
    "scripts_denied",
]


@dataclass(frozen=True, slots=True)
class Features:
    xackdel: bool = False

    @property
    def xackdel_flag(self) -> str:
        return "1" if self.xackdel else "0"


COMPAT = Features()


def fast_paths_default() -> bool:
    return os.environ.get("CHASQUI_FAST_PATHS", "1").strip().lower() not in ("0", "false", "no", "off")


def detect_call() -> Call:
    return command("COMMAND", "INFO", "XACKDEL")


def parse_features(reply: Any) -> Features:
    has = bool(reply) and reply[0] is not None and len(reply[0]) > 0
    return Features(xackdel=has)


FUNCTIONS_ENV = "CHASQUI_FUNCTIONS"


def functions_mode() -> str:
    """``CHASQUI_FUNCTIONS``: ``auto`` (default) runs FCALL when the library is loaded and loads
    it (FUNCTION LOAD) where the connection may; ``use`` runs FCALL when it is loaded but never
    loads it; ``off`` runs EVALSHA only."""
    raw = os.environ.get(FUNCTIONS_ENV, "auto")
    value = raw.strip().lower()
    if value in ("", "auto", "1", "on", "true", "yes"):
        return "auto"
    if value in ("use", "off"):
        return value
    if value in ("0", "false", "no"):
        return "off"
    raise ConfigError(f"{FUNCTIONS_ENV}={raw!r}: expected auto, use or off")


def probe_call() -> Call:
    """FCALL_RO of the library's probe (pre-packed: it may take the lane)."""
    args = ("FCALL_RO", _scripts.LIBRARY.probe, 0)
    return packed_command(args, b"*3\r\n" + b"".join(resp_bulk(a) for a in args))


def probe_found(reply: Any) -> bool:
    found: bool = reply == _scripts.LIBRARY.name.encode()
    return found


def load_call(replace: bool = False) -> Call:
    return command("FUNCTION", "LOAD", *(("REPLACE",) if replace else ()), _scripts.LIBRARY.source)


def scripts_denied(script: str) -> str:
    """The error for a user who may neither FCALL the library nor EVALSHA."""
    return (
        f"cannot run script {script}: this user may not run EVALSHA, and the Redis Functions library "
        f"{_scripts.LIBRARY.name} is not loaded there (or FCALL/FCALL_RO are not granted); load it with "
        "`chasqui functions install --redis-url <admin url>` (see SECURITY.md)"
    )
