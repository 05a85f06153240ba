"""``benchmarks/bench_retry.py`` in smoke mode, so it cannot rot.  Shape only: never a timed
assertion.  It runs as a subprocess on its own private ``redis-server``; the slow log it turns
on is that server's, and it is put back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
def test_bench_retry_splits_a_retried_job_into_its_steps(tmp_path: Path) -> None:
    out = tmp_path / "retry.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_retry.py"), "--smoke", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["n"] == 500 and set(data["figures"]) == {"plain", "override", "retry"}
    for mode, f in data["figures"].items():
        for key in ("jobs_per_s", "worker_cpu_us_per_job", "redis_cpu_us_per_job"):
            assert f[key] > 0, (mode, key, f)
    steps = data["redis_us_per_job_by_step"]
    assert set(steps) == {"XREADGROUP", "emit_events", "fail_batch", "promote", "complete_batch"}
    assert all(v > 0 for v in steps.values()), steps  # every step of a retried job was seen
