"""What users install: the wheel and sdist hatchling builds from this checkout carry the licence, the
typing marker, the Lua scripts and the dependency metadata of pyproject.toml; the lowest-versions
constraints of scripts/matrix.sh are pyproject's floors; the chasquimq tests are marked ``interop``."""

from __future__ import annotations

import ast
import email.parser
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]
LUA = sorted(str(p.relative_to(ROOT / "lua")) for p in (ROOT / "lua").rglob("*.lua"))  # include/ too
DASHBOARD_ASSETS = ["templates/layout.html", "static/dashboard.css", "static/dashboard.js"]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-d", str(out), "-t", "wheel", "-t", "sdist"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("*.whl")
    (sdist,) = out.glob("*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def _key(req: Requirement) -> tuple[str, str, tuple[str, ...], str]:
    return req.name.lower(), str(req.specifier), tuple(sorted(req.extras)), str(req.marker or "")


def _expected_requires() -> set[tuple[str, str, tuple[str, ...], str]]:
    want = {_key(Requirement(dep)) for dep in PROJECT["dependencies"]}
    for extra, deps in PROJECT["optional-dependencies"].items():
        want |= {_key(Requirement(f'{dep}; extra == "{extra}"')) for dep in deps}
    return want


def _check_metadata(text: str) -> None:
    meta = email.parser.Parser().parsestr(text)
    assert meta["Name"] == PROJECT["name"] and meta["Version"] == PROJECT["version"]
    assert meta["License-Expression"] == "Apache-2.0" and meta.get_all("License-File") == ["LICENSE"]
    assert set(meta.get_all("Provides-Extra")) == set(PROJECT["optional-dependencies"])
    assert {_key(Requirement(r)) for r in meta.get_all("Requires-Dist")} == _expected_requires()


def test_wheel_has_license_typing_marker_lua_and_metadata(dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as whl:
        names = set(whl.namelist())
        (info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        assert whl.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        assert "airflow_provider_chasqui/py.typed" in names
        for lua in LUA:
            assert whl.read(f"airflow_provider_chasqui/lua/{lua}") == (ROOT / "lua" / lua).read_bytes()
        pools = "airflow_provider_chasqui/worker/fairscheduler.xml"  # the Spark worker's FAIR pools
        assert whl.read(pools) == (ROOT / pools).read_bytes()
        _check_metadata(whl.read(f"{info}/METADATA").decode())
        entry_points = whl.read(f"{info}/entry_points.txt").decode()
        assert (
            "[airflow.plugins]\nchasqui_dashboard = airflow_provider_chasqui.dashboard.plugin:ChasquiDashboardPlugin"
            in entry_points
        ), entry_points
        for asset in DASHBOARD_ASSETS:  # the dashboard loads nothing from the internet: its files ship here
            assert (
                whl.read(f"airflow_provider_chasqui/dashboard/{asset}")
                == (ROOT / "airflow_provider_chasqui" / "dashboard" / asset).read_bytes()
            ), asset
        assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)


def test_documentation_link_is_where_the_readme_is_published(dist: dict[str, Path]) -> None:
    """Airflow shows pyproject's ``Documentation`` URL as the provider's ``documentation-url``, and
    ``get_provider_info``'s integration links the same page: the project page of this very
    distribution, whose description is the README (no placeholder organisation or repository)."""
    from airflow_provider_chasqui.get_provider_info import get_provider_info

    url = PROJECT["urls"]["Documentation"]
    assert url == f"https://pypi.org/project/{PROJECT['name']}/"
    assert get_provider_info()["integrations"][0]["external-doc-url"] == url
    with zipfile.ZipFile(dist["wheel"]) as whl:
        (info,) = {n.split("/")[0] for n in whl.namelist() if n.endswith(".dist-info/METADATA")}
        meta = email.parser.Parser().parsestr(whl.read(f"{info}/METADATA").decode())
    assert meta.get_all("Project-URL") == [f"Documentation, {url}"]
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == (ROOT / "README.md").read_text().strip()  # the page shows the README


def test_sdist_has_license_typing_marker_lua_and_metadata(dist: dict[str, Path]) -> None:
    with tarfile.open(dist["sdist"]) as sdist:
        top = sdist.getnames()[0].split("/")[0]
        members = {n.removeprefix(f"{top}/") for n in sdist.getnames()}
        for name in (
            "LICENSE",
            "README.md",
            "CHANGELOG.md",
            "pyproject.toml",
            "airflow_provider_chasqui/py.typed",
            *(f"lua/{lua}" for lua in LUA),
        ):
            assert name in members, name
        assert sdist.extractfile(f"{top}/LICENSE").read() == (ROOT / "LICENSE").read_bytes()
        _check_metadata(sdist.extractfile(f"{top}/PKG-INFO").read().decode())


def test_license_is_the_apache_2_text() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.strip().startswith("Apache License\n                           Version 2.0, January 2004")
    assert "END OF TERMS AND CONDITIONS" in text and PROJECT["license"] == "Apache-2.0"


def _names(extra: str) -> set[str]:
    return {Requirement(dep).name.lower() for dep in PROJECT["optional-dependencies"][extra]}


def test_extras_keep_conflicting_packages_apart() -> None:
    # the Spark provider drags in pyspark-client, which overwrites pyspark's files: not in `spark`
    assert _names("spark") == {"pyspark", "pyarrow"}
    assert "apache-airflow-providers-apache-spark" in _names("spark-airflow")
    # chasquimq caps redis-py below 7: only its own extra, never the test tools the matrix venvs get
    assert "chasquimq" in _names("interop") and all(
        "chasquimq" not in _names(e) for e in PROJECT["optional-dependencies"] if e != "interop"
    )
    # pyarrow wherever the package or its examples read Parquet
    assert "pyarrow" in _names("parquet")


def test_lowest_constraints_are_the_floors() -> None:
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "constraints" / "lowest.txt").read_text().splitlines()]
    pinned = {}
    for req in (Requirement(ln) for ln in lines if ln):
        (spec,) = req.specifier
        assert spec.operator == "==", req
        pinned[req.name.lower()] = Version(spec.version)
    floors = {}
    for req in map(Requirement, PROJECT["dependencies"]):
        floors.update({req.name.lower(): Version(s.version) for s in req.specifier if s.operator == ">="})
    assert pinned == {name: floors[name] for name in ("redis", "msgpack", "croniter")}


def _parse(source: str) -> ast.AST:
    """``ast.parse``, once more on CPython 3.11's "AST constructor recursion depth mismatch"
    (gh-106905: the converter's depth counter is shared by threads, and an earlier test's
    threads may still be converting; fixed in later 3.11/3.12 releases).  Seen once in CI."""
    try:
        return ast.parse(source)
    except SystemError as exc:
        if "recursion depth mismatch" not in str(exc):
            raise
        return ast.parse(source)


def test_chasquimq_tests_are_marked_interop_and_import_it_lazily() -> None:
    """scripts/test.sh deselects `-m "not interop"` in a venv without chasquimq; the matrix's interop venv
    runs exactly the marked modules.  A module importing chasquimq at the top would break collection."""
    marked = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = _parse(path.read_text())
        top_imports = {
            alias.name.split(".")[0] for node in tree.body if isinstance(node, ast.Import) for alias in node.names
        }
        top_imports |= {(node.module or "").split(".")[0] for node in tree.body if isinstance(node, ast.ImportFrom)}
        assert "chasquimq" not in top_imports, f"{path}: import chasquimq through the `chasquimq` fixture"
        uses = any(
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(a.arg == "chasquimq" for a in node.args.args)
            for node in ast.walk(tree)
        )
        if uses:
            assert "pytest.mark.interop" in path.read_text(), f"{path} uses chasquimq but is not marked interop"
            marked.append(path.name)
    assert {"test_engine_interop.py", "test_sched_interop.py"} <= set(marked)  # the scan finds them
