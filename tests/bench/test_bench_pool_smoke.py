"""``benchmarks/bench_pool.py`` in a small run, so it cannot rot.  Shape only: every
configuration ran every job (never a timed assertion on speed)."""

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
def test_pool_bench_smoke(tmp_path: Path) -> None:
    out = tmp_path / "pool.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_pool.py"), "--repeats", "1", "--jobs", "20,300"]
        + ["--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"bench_pool failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    res = json.loads(out.read_text())
    assert set(res["medians"]) == {"burn/0", "burn/1", "burn/2", "noop/0", "noop/2", "anoop/0", "anoop/2"}
    assert all(m["rate"] > 0 and m["cpu_us_per_job"] >= 0 for m in res["medians"].values())
    assert len(res["ratios"]) == 4 and "burn: 2 processes / in process" in proc.stdout
