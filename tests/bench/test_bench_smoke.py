"""The benchmark scripts in smoke mode, so they cannot rot.  Shape only: never a timed assertion.

Each script runs as a subprocess on its own private ``redis-server`` (as it does on demand);
the test checks the JSON it writes has the expected keys and positive numbers.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
ENGINE_WORKLOADS = {
    "limit_sync_xadd_single",
    "limit_sync_xadd_pipeline",
    "ref_async_xadd_single",
    "ref_sync_lua_batch",
    "queue_add",
    "syncqueue_add",
    "queue_add_bulk",
    "syncqueue_add_bulk",
    "e2e_process",
    "e2e_rate_unbounded",
    "e2e_concurrency_unbounded",
    "e2e_delayed",
    "e2e_retry",
}
PEER_WORKLOADS = {"enqueue_single", "enqueue_bulk", "process", "delayed"}

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="the benchmarks start their own redis-server"),
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, f"{args[0]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _positive(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("bench")
    paths = {
        "engine": out / "engine.json",
        "peers": out / "peers.json",
        "report": out / "report.json",
        "png": out / "report.png",
    }
    _run(str(BENCH / "bench_engine.py"), "--smoke", "--out", str(paths["engine"]))
    _run(str(BENCH / "run_peers.py"), "--smoke", "--peers", "chasqui", "--no-install", "--out", str(paths["peers"]))
    _run(
        str(BENCH / "report.py"),
        "--engine",
        str(paths["engine"]),
        "--peers",
        str(paths["peers"]),
        "--scheduler",
        str(out / "absent.json"),
        "--out-json",
        str(paths["report"]),
        "--out-png",
        str(paths["png"]),
    )
    return paths


def test_engine_smoke_json_has_every_workload_with_positive_figures(smoke_results: dict[str, Path]) -> None:
    data = json.loads(smoke_results["engine"].read_text())
    assert data["meta"]["smoke"] is True and data["meta"]["n"] == 500
    assert data["meta"]["redis_version"]
    assert set(data["results"]) >= ENGINE_WORKLOADS
    for name in ENGINE_WORKLOADS:
        res = data["results"][name]
        assert _positive(res["jobs_per_s"]) and _positive(res["seconds"]), name
        assert len(res["runs"]) == 1
    for name in ("queue_add", "queue_add_bulk", "e2e_process"):
        assert _positive(data["results"][name]["ratio"]), name
    assert _positive(data["results"]["e2e_process"]["client_cpu_us_per_job"])
    assert data["results"]["e2e_process"]["completed_events"] >= 500
    assert set(data["targets"]) and all(isinstance(t["met"], bool) for t in data["targets"].values())


def test_peers_runner_smoke_measures_this_project_through_the_peer_skeleton(smoke_results: dict[str, Path]) -> None:
    data = json.loads(smoke_results["peers"].read_text())
    ours = data["results"]["chasqui"]
    assert set(ours) == PEER_WORKLOADS
    for workload in PEER_WORKLOADS:
        assert _positive(ours[workload]["jobs_per_s"]), workload
        assert _positive(ours[workload]["client_cpu_us_per_job"]), workload


def test_report_merges_the_smoke_outputs(smoke_results: dict[str, Path]) -> None:
    report = json.loads(smoke_results["report"].read_text())
    rows = {r["workload"]: r for r in report["rows"]}
    assert set(rows) == PEER_WORKLOADS
    for workload, row in rows.items():
        assert _positive(row["chasqui"]), workload
        assert _positive(row["limit_jobs_per_s"]), workload
        assert _positive(row["ratio_to_limit"]), workload
    assert report["inputs_missing"] == ["scheduler"]
    png = smoke_results["png"].read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_latency_smoke_json_has_both_percentiles(tmp_path: Path) -> None:
    out = tmp_path / "latency.json"
    proc = _run(str(BENCH / "bench_latency.py"), "--smoke", "--out", str(out))
    assert "enqueue -> handler start" in proc.stdout and "job completion -> trigger event" in proc.stdout
    data = json.loads(out.read_text())
    e, t = data["enqueue_to_handler"], data["completion_to_trigger"]
    assert e["jobs"] == 500 and _positive(e["achieved_rate"])
    assert t["jobs"] == 20  # every trigger fired with status success (the script asserts it)
    for block in (e, t):
        assert _positive(block["p50_ms"]) and block["p99_ms"] >= block["p50_ms"]
