"""``benchmarks/bench_waiters.py`` in smoke mode, so it cannot rot.  Shape only: never a timed
assertion; the one exact figure is structural (the waiters share one named event reader)."""

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
def test_waiters_smoke_shares_one_reader(tmp_path: Path) -> None:
    out = tmp_path / "waiters.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_waiters.py"), "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"bench_waiters failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(out.read_text())
    res = data["results"]
    assert data["mode"] == "smoke" and res["mode"] == "hub" and res["waiters"] == 50
    assert res["named_event_readers"] == 1  # one reader for 50 waiting triggers
    assert 1 <= res["redis_connections"] <= 3  # the reader and the hub's lookup lane (not one per trigger)
    assert res["woken"] >= 1 and res["jobs"] > 0
    for key in ("cpu_pct_of_core", "wake_p50_ms", "wake_p99_ms", "achieved_rate"):
        assert isinstance(res[key], (int, float)) and res[key] >= 0, key
    assert "waiting triggers (hub)" in proc.stdout
