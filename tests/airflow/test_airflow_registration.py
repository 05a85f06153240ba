"""The provider as Airflow sees it (the real ``airflow`` CLI in a subprocess), and the
promise that worker pods never need Airflow: the engine side must not import it.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from airflow_provider_chasqui.get_provider_info import get_provider_info

pytestmark = pytest.mark.timeout(600)


def _airflow(env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ours = [block for block in proc.stderr.split("Traceback")[1:] if "airflow_provider_chasqui" in block]
    assert not ours, "".join(ours)[-3000:]  # our provider loads cleanly (others' warnings are theirs)
    return proc.stdout


def _row(output: str, needle: str) -> list[str]:
    rows = [[c.strip() for c in line.split("|")] for line in output.splitlines() if needle in line]
    assert rows, f"{needle!r} not in:\n{output}"
    return rows[0]


def test_package_name_matches_the_distribution() -> None:
    info = get_provider_info()
    assert info["package-name"] == importlib.metadata.metadata("airflow-provider-chasqui")["Name"]
    eps = importlib.metadata.entry_points(group="apache_airflow_provider")
    assert [ep.value for ep in eps if ep.dist.name == "airflow-provider-chasqui"] == [
        "airflow_provider_chasqui.get_provider_info:get_provider_info"
    ]


def test_every_listed_module_and_class_imports() -> None:
    import importlib

    info = get_provider_info()
    for kind in ("hooks", "operators", "sensors", "triggers"):
        for module in info[kind][0]["python-modules"]:
            importlib.import_module(module)
    path, _, name = info["connection-types"][0]["hook-class-name"].rpartition(".")
    hook = getattr(importlib.import_module(path), name)
    assert hook.conn_type == info["connection-types"][0]["connection-type"] == "chasqui"


def test_airflow_cli_shows_the_provider(airflow_home: dict[str, str]) -> None:
    version = importlib.metadata.version("airflow-provider-chasqui")
    listed = _row(_airflow(airflow_home, "providers", "list"), "airflow-provider-chasqui")
    assert listed[0] == "airflow-provider-chasqui" and listed[-1] == version
    print("airflow providers list:", " | ".join(listed))
    hooks = _row(_airflow(airflow_home, "providers", "hooks"), "ChasquiHook")
    assert hooks[:3] == ["chasqui", "airflow_provider_chasqui.hooks.chasqui.ChasquiHook", "chasqui_conn_id"]
    triggers = _airflow(airflow_home, "providers", "triggers")  # row order follows the hash seed
    for module in ("airflow_provider_chasqui.triggers.job", "airflow_provider_chasqui.triggers.queue_events"):
        assert any(module in line and "airflow-provider-chasqui" in line for line in triggers.splitlines()), triggers
    widgets = _airflow(airflow_home, "providers", "widgets")
    for field in ("db", "default_queue", "tls", "mode", "sentinel_service", "sentinels"):
        assert f"extra__chasqui__{field}" in widgets
    assert "chasqui" in _airflow(airflow_home, "providers", "behaviours")
    assert "default_deferrable" in _airflow(airflow_home, "config", "list", "--section", "chasqui")


ENGINE_SIDE = [
    "airflow_provider_chasqui",
    "airflow_provider_chasqui.engine.worker",
    "airflow_provider_chasqui.sync.queue",
    "airflow_provider_chasqui.examples.handlers",
    "airflow_provider_chasqui.examples.dag_defaults",
    "airflow_provider_chasqui.hooks._connection",
    "airflow_provider_chasqui.get_provider_info",
]


@pytest.mark.parametrize("module", ENGINE_SIDE)
def test_engine_side_never_imports_airflow(module: str) -> None:
    code = f"import sys, {module}; bad = sorted(m for m in sys.modules if m.split('.')[0] == 'airflow'); print(bad)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_loading_the_dashboard_plugin_does_not_build_its_app(airflow_home: dict[str, str]) -> None:
    """Issue 28: every process that loads plugins imports the plugin; the web app is built on
    its first request (``LazyApp``), not then (it cost 0.26 s per process)."""
    code = (
        "import sys, time; t = time.perf_counter()\n"
        "import airflow_provider_chasqui.dashboard.plugin as p\n"
        "app = p.ChasquiDashboardPlugin.fastapi_apps[0]['app']\n"
        "print(type(app).__name__, app.built, 'airflow_provider_chasqui.dashboard.app' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=airflow_home, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["LazyApp", "False", "False"], out.stdout
