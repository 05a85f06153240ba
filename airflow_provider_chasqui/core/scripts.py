"""The Lua scripts, loaded once from ``lua/*.lua`` with their SHA1s.

The wheel ships ``lua/`` as ``airflow_provider_chasqui/lua``; a source checkout reads the
top-level ``lua/`` folder.  Scripts are identified by file stem (``SCRIPTS["promote"]``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

__all__ = ["Script", "SCRIPTS", "lua_dir"]


@dataclass(frozen=True, slots=True)
class Script:
    name: str
    body: bytes
    sha: str


def lua_dir() -> Path:
    packaged = resources.files("airflow_provider_chasqui") / "lua"
    if packaged.is_dir():
        return Path(str(packaged))
    source = Path(__file__).resolve().parents[2] / "lua"
    if source.is_dir():
        return source
    raise FileNotFoundError("the lua/ scripts are missing from this installation")


def _load() -> dict[str, Script]:
    out = {}
    for path in sorted(lua_dir().glob("*.lua")):
        body = path.read_bytes()
        out[path.stem] = Script(path.stem, body, hashlib.sha1(body).hexdigest())
    return out


SCRIPTS: dict[str, Script] = _load()
