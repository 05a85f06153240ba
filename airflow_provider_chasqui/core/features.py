"""Which Redis 8 fast paths a server offers, decided once per connection.

Only XACKDEL (Redis 8.2+) is used as a fast path: ChasquiMQ's other Redis 8 commands
(XREADGROUP CLAIM 8.4, XADD IDMP 8.6) cannot be tested on any server available to this
project, so their Redis 7.0 equivalents (XPENDING + XCLAIM recovery, a Lua marker) are the
only paths.  ``CHASQUI_FAST_PATHS=0`` (or ``fast_paths=False``) forces the 7.0 path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from .calls import Call, command

__all__ = ["Features", "detect_call", "parse_features", "fast_paths_default", "COMPAT"]


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
