"""``benchmarks/bench_soak.py`` for ~20 s, so it cannot rot, and the bound it demonstrates:
with the defaults of ``chasqui worker`` (results stored), the key count stays at the results
cap however many jobs run.  Before issue #12 every job left a result key for 24 h, so this
run would have ended with one key per job (tens of thousands)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_chasqui.core.settings import QueueSettings

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="the benchmark starts its own redis-server")
def test_soak_smoke_keeps_the_key_count_at_the_results_cap(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_soak.py"),
            "--minutes",
            "0.33",
            "--rate",
            "2000",
            "--interval",
            "1",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, f"bench_soak failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    data = json.loads(out.read_text())
    assert "first third" in proc.stdout and "slope/min" in proc.stdout
    assert data["meta"]["private_server"] is True and len(data["samples"]) >= 5
    for metric in ("used_memory", "memory_excl_stream", "dbsize", "result_keys", "events_len", "worker_rss", "backlog"):
        assert set(data["summary"][metric]) == {"first_third", "last_third", "change_pct", "slope_per_min", "max"}
    cap = QueueSettings().results_max_len
    # far more jobs than the cap ran (shape, not speed: the bar is a quarter of the offer) ...
    assert data["offered"] > 2 * cap, data["offered"]
    assert data["backlog_after_drain"] == 0
    # ... yet the results index, and the whole keyspace, never went past the cap (+ the queue's
    # own few keys: stream, events, delayed, indexes, promoter lock)
    assert max(s["result_keys"] for s in data["samples"]) <= cap
    assert data["summary"]["dbsize"]["max"] <= cap + 10, data["summary"]["dbsize"]
