"""The core imports alone (issue #17): no redis, asyncio, sockets or hiredis, nothing above the
core, and no Lua read from disk until a script is used; the package ``__init__`` is lazy
(PEP 562) and still serves every public name.  Each check runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = "airflow_provider_chasqui"
CORE = sorted(p.stem for p in (ROOT / PKG / "core").glob("*.py") if p.stem != "__init__")
IO = ("redis", "asyncio", "socket", "hiredis")


def _fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter (this tree first on the path); it prints one JSON line."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env, timeout=60, cwd=ROOT
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _loaded(prelude: str) -> dict:
    return _fresh(
        prelude
        + f"""
import json, sys
mods = sorted(sys.modules)
scripts = sys.modules.get("{PKG}.core.scripts")
print(json.dumps({{"io": [m for m in {IO!r} if m in sys.modules],
                  "above": [m for m in mods if m.startswith("{PKG}.")
                            and not m.startswith(("{PKG}.core", "{PKG}.errors"))],
                  "lua_read": scripts is not None and "SCRIPTS" in vars(scripts),
                  "from": __import__("{PKG}").__file__}}))
"""
    )


@pytest.mark.timeout(120)
def test_core_keys_and_codec_import_no_io_and_nothing_above_the_core() -> None:
    got = _loaded(f"import {PKG}.core, {PKG}.core.keys, {PKG}.core.codec")
    assert got["from"].startswith(str(ROOT))
    assert got == {"io": [], "above": [], "lua_read": False, "from": got["from"]}


@pytest.mark.timeout(120)
def test_every_core_module_imports_without_io_upward_imports_or_reading_lua() -> None:
    got = _loaded("\n".join(f"import {PKG}.core.{m}" for m in CORE))
    assert (got["io"], got["above"], got["lua_read"]) == ([], [], False)


@pytest.mark.timeout(120)
def test_the_lua_scripts_are_read_on_first_use() -> None:
    got = _fresh(f"""
import json
from {PKG}.core import calls, scripts
before = "SCRIPTS" in vars(scripts)
call = calls.script_call("promote", ("k",), ())
print(json.dumps({{"before": before, "after": "SCRIPTS" in vars(scripts), "sha": call.script.sha,
                  "library": scripts.LIBRARY.name}}))
""")
    assert got["before"] is False and got["after"] is True
    assert len(got["sha"]) == 40 and got["library"].startswith("chasqui_")


@pytest.mark.timeout(120)
def test_the_package_is_lazy_and_still_serves_every_public_name() -> None:
    got = _fresh(f"""
import json, sys
import {PKG} as p
bare = [m for m in {IO!r} if m in sys.modules]
from {PKG} import Queue, SyncQueue, Worker, AsyncQueue, BackoffSpec, RepeatPattern, UnrecoverableError
from {PKG}.types import BackoffSpec as TypesBackoff
names = {{n: type(getattr(p, n)).__name__ for n in p.__all__}}
print(json.dumps({{"bare": bare, "names": names, "alias": AsyncQueue is Queue, "same": TypesBackoff is BackoffSpec,
                  "engine": p.engine.__name__, "dir": sorted(set(p.__all__) - set(dir(p)))}}))
""")
    assert got["bare"] == []  # the package alone: no redis, asyncio or sockets either
    assert got["alias"] and got["same"] and got["engine"] == f"{PKG}.engine" and got["dir"] == []
    assert (
        len(got["names"]) == 39
        and got["names"]["RateLimit"]
        == got["names"]["RateLimited"]
        == got["names"]["JobTimeout"]
        == got["names"]["ChildProcessDied"]
        == got["names"]["WrongTypeError"]
        == "type"
        and got["names"]["Queue"] == "type"
        and got["names"]["version"] == "function"
    )


def test_the_errors_users_catch_are_exported_from_the_package() -> None:
    """Code catches what it can import from the package: the errors raised to callers and
    handlers (the driver-level ``ScriptError`` subclasses stay in ``errors``)."""
    import airflow_provider_chasqui as pkg
    from airflow_provider_chasqui import errors

    caught = [
        "ChasquiError",
        "ConfigError",
        "ChasquiConnectionError",
        "ScriptError",
        "CodecError",
        "JobFailed",
        "JobNotFound",
        "HandlerNotFound",
        "NotSupportedError",
        "UnrecoverableError",
    ]
    missing = [n for n in caught if n not in pkg.__all__ or getattr(pkg, n) is not getattr(errors, n)]
    assert not missing, f"not exported by the package: {missing}"
