"""``benchmarks/bench_rate_limit.py`` at one low limit, so it cannot rot.  Its one structural
figure is exact: the script grants per aligned window, so no one-second window of grants (the
workers' grant log, the server's clock) holds more than the limit; at a low limit the jobs are
granted at a window's start, so their ``active`` events fall in it too (never a timed
assertion on speed)."""

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
def test_rate_limit_smoke(tmp_path: Path) -> None:
    out = tmp_path / "rate.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_rate_limit.py"), "--limits", "40", "--seconds", "3"]
        + ["--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"bench_rate_limit failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    (res,) = json.loads(out.read_text())["results"]
    assert res["limit_per_s"] == 40 and res["started"] == res["jobs"] == res["granted"] == 120
    assert res["busiest_window_granted"] <= 40 and res["busiest_window"] <= 40
    assert "busiest 1 s: granted" in proc.stdout
