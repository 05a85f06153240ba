"""The scheduler benchmark runs (smoke size, its own Redis, fires among the stored specs) and
reports every figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--smoke", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, json.loads(out.read_text())


def test_bench_scheduler_smoke(tmp_path: Path) -> None:
    proc, data = run_bench("bench_scheduler.py", tmp_path / "scheduler.json", "--at-size")
    assert data["mode"] == "smoke" and data["redis_version"]
    mem, up, burst, spread = data["memory"], data["upsert"], data["fire_burst"], data["fire_spread"]
    assert mem["specs"] == 20_000 and mem["stored_spec_bytes"] > 100
    assert 200 < mem["floor_bytes_per_spec"] < 2000
    assert mem["ratio"] <= 1.1  # no per-spec keys of our own: memory does not depend on load
    assert up["upsert_specs_per_s"] > 0 and burst["fires_per_s"] > 0 and burst["fires"] == 5_000
    for phase in (burst, spread):
        assert 0 <= phase["lag_p50_ms"] <= phase["lag_p99_ms"] <= phase["lag_max_ms"]
        assert phase["next_fire_computations"] <= 4 * phase["ticks"] + 60  # shared, not one per spec
    assert burst["among_specs"] == spread["among_specs"] == 20_000  # fired among the stored specs
    assert 0 < data["client_peak_rss_mb"] < 2000 and data["redis_used_memory_mb"] > 0
    assert set(data["meets"]) == {"memory_ratio", "upsert_rate", "fire_rate", "spread_lag_p99"}
    assert "memory per spec" in proc.stdout and "fire spread" in proc.stdout


def test_bench_scheduler_cluster_smoke(tmp_path: Path) -> None:
    """The cluster benchmark (its own 3-master cluster): every shard on its own master, every
    fire accounted for per shard, memory per spec in the same range as one server's."""
    _proc, data = run_bench("bench_scheduler_cluster.py", tmp_path / "cluster.json")
    shards = data["shards"]
    assert data["masters"] == 3 and len({s["port"] for s in shards}) == 3
    assert sum(s["specs"] for s in shards) == data["specs"] == 30_000
    assert sum(s["fires"] for s in shards) == data["burst"]["fires"] == 3_000
    assert all(s["specs"] > 0 and 200 < s["bytes_per_spec"] < 2000 and s["fires"] > 0 for s in shards)
    assert data["upsert_specs_per_s"] > 0 and data["burst"]["fires_per_s"] > 0
