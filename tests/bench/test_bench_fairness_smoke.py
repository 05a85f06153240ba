"""``benchmarks/bench_fairness.py`` in a small run, so it cannot rot.  Shape only, plus the one
structural figure: with round-robin turns, the big group runs one job per turn while the small
groups drain (never a timed assertion)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="the benchmark starts its own redis-server")
def test_fairness_smoke(tmp_path: Path) -> None:
    out = tmp_path / "fairness.json"
    args = ["--big", "500", "--groups", "5", "--per-group", "4", "--repeats", "1", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_fairness.py"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"bench_fairness failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert run["big_started_before_last_small"] <= 4  # one per turn: four turns drain 5 groups of 4
    assert run["small_wait_ms"]["p50"] <= run["small_wait_ms"]["p99"] <= run["small_wait_ms"]["max"]
    assert data["summary"]["bound"] == 2000 and run["jobs_per_s"] > 0
