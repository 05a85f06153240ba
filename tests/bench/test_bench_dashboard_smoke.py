"""``benchmarks/bench_dashboard.py`` in smoke mode, so it cannot rot: shape only, never a timed assertion."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="the benchmark starts its own redis-server"),
]


def test_dashboard_bench_smoke(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn")
    out = tmp_path / "dashboard.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_dashboard.py"),
            "--smoke",
            "--repeat",
            "2",
            "--jobs",
            "3000",
            "--specs",
            "3000",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["jobs"] == 3000 and data["specs"] == 3000
    assert {"queues", "queue", "job (middle of 1M)", "dlq first page", "schedules prefix", "workers"} <= set(
        data["pages"]
    )
    assert all(p["median_ms"] > 0 for p in data["pages"].values())
