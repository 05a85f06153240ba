"""Run chasquimq's own Python tests against this package, through the ``chasquimq`` alias.

chasquimq's tests (``chasquimq-py/tests`` in jotarios/chasquimq) are not shipped in its wheel or
sdist and are never copied into this repository: point this script at a directory holding them
(with their ``conftest.py``)::

    PYTHONPATH=$PWD ~/.cache/airflow-provider-chasqui/venv/bin/python scripts/chasquimq_suite.py DIR
    ... scripts/chasquimq_suite.py DIR --files test_high_level.py -- -x -k delay

It installs ``airflow_provider_chasqui.compat.chasquimq`` as ``chasquimq``, adds the one private
module the tests read (``chasquimq._encoding``: msgpack helpers, served by our codec), and runs
pytest on the files (default ``test_high_level.py``) against Redis on 127.0.0.1:6379
(``CHASQUIMQ_TEST_REDIS_URL`` overrides), each test under a timeout.  The tests listed in
``scripts/chasquimq_suite_deselect.txt`` (or ``--deselect-file``: those needing chasquimq
internals, with the reason each) are deselected; a listed test the files no longer hold is
reported.  The exit code is pytest's.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESELECT_FILE = ROOT / "scripts" / "chasquimq_suite_deselect.txt"
DEFAULT_FILES = ("test_high_level.py",)


def read_deselected(path: Path = DESELECT_FILE) -> dict[str, str]:
    """``file.py::test_name`` -> reason, from lines ``file.py::test_name | reason`` (# comments)."""
    out: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        node, sep, reason = line.partition("|")
        if not sep or not reason.strip():
            raise SystemExit(f"{path}: every entry needs '| reason': {raw!r}")
        out[node.strip()] = reason.strip()
    return out


def install_alias() -> None:
    sys.path.insert(0, str(ROOT))  # this checkout's package, whatever is installed
    from airflow_provider_chasqui.compat import chasquimq
    from airflow_provider_chasqui.core.codec import decode_data, encode_data

    chasquimq.install()
    # chasquimq's tests decode stream entries with its private msgpack helpers: test-only, so here
    encoding = ModuleType("chasquimq._encoding", "msgpack helpers for chasquimq's tests (our codec)")
    encoding.encode_payload = encode_data  # type: ignore[attr-defined]
    encoding.decode_payload = decode_data  # type: ignore[attr-defined]
    sys.modules["chasquimq._encoding"] = encoding


class Deselect:
    """pytest plugin: drops the listed tests and reports entries that match nothing."""

    def __init__(self, listed: dict[str, str]) -> None:
        self.listed = listed
        self.seen: set[str] = set()

    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        keep, drop = [], []
        for item in items:
            base = item.nodeid.split("[", 1)[0]
            if base in self.listed:
                self.seen.add(base)
                drop.append(item)
            else:
                keep.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        if self.seen:
            tr.section("deselected: chasquimq tests using non-public API")
            for node in sorted(self.seen):
                tr.write_line(f"{node}: {self.listed[node]}")
        stale = sorted(n for n in self.listed if n.split("::")[0] in self.files and n not in self.seen)
        if stale:
            tr.section("listed for deselection but not collected")
            for node in stale:
                tr.write_line(node)

    files: tuple[str, ...] = ()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests_dir", type=Path, help="directory with chasquimq's tests and conftest.py")
    parser.add_argument("--files", nargs="+", default=list(DEFAULT_FILES), help="test files to run")
    parser.add_argument("--timeout", type=int, default=60, help="seconds per test (default 60)")
    parser.add_argument("--deselect-file", type=Path, default=DESELECT_FILE, help="default: %(default)s")
    parser.epilog = "Arguments after -- go to pytest."
    cut = argv.index("--") if "--" in argv else len(argv)
    args, pytest_args = parser.parse_args(argv[:cut]), argv[cut + 1 :]
    tests_dir = args.tests_dir.resolve()
    missing = [f for f in ("conftest.py", *args.files) if not (tests_dir / f).is_file()]
    if missing:
        parser.error(f"{tests_dir} lacks {', '.join(missing)}")
    os.environ.setdefault("CHASQUIMQ_TEST_REDIS_URL", "redis://127.0.0.1:6379")
    install_alias()
    plugin = Deselect(read_deselected(args.deselect_file))
    plugin.files = tuple(args.files)
    os.chdir(tests_dir)  # node ids relative to it (``test_high_level.py::...``)
    return int(
        pytest.main(
            [
                "-c",
                os.devnull,  # none of our (or their) pytest settings: only the ones below
                f"--rootdir={tests_dir}",
                "-p",
                "no:cacheprovider",
                "-o",
                "asyncio_mode=strict",
                "-o",
                "asyncio_default_fixture_loop_scope=function",
                f"--timeout={args.timeout}",
                "-rfE",
                *args.files,
                *pytest_args,
            ],
            plugins=[plugin],
        )
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
