"""``benchmarks/bench_functions.py`` in a few calls, so it cannot rot.  Shape only: never a
timed assertion.  It runs as a subprocess on its own private ``redis-server``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_bench_functions_measures_both_commands(tmp_path: Path) -> None:
    out = tmp_path / "functions.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_functions.py"),
            "--blocks",
            "2",
            "--per-block",
            "2",
            "--jobs",
            "20",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert results["jobs_per_call"] == 20
    for key in ("pack_us_evalsha", "pack_us_fcall", "server_us_evalsha", "server_us_fcall"):
        assert isinstance(results[key], float) and results[key] > 0, (key, results)
