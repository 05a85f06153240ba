"""``benchmarks/bench_cluster_failover.py`` in smoke mode, so it cannot rot, and so a sharded
scheduler is seen to live through a cluster master's loss: the dead master's shard fires again
on its promoted replica and the other shards never stop.  Shape only: never a timed assertion
(the promotion takes what ``cluster-node-timeout`` and the election take).  The cluster is the
script's own (six redis-server processes on free ports, stopped by pid)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(shutil.which("redis-cli") is None, reason="redis-cli builds the cluster")
def test_a_sharded_scheduler_fires_again_after_its_master_fails_over(tmp_path: Path) -> None:
    out = tmp_path / "failover.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_cluster_failover.py"),
            "--smoke",
            "--after",
            "2",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["promotion_s"] > 0
    assert data["shard0_back_after_kill_s"] >= data["promotion_s"]  # it fired on the promoted replica
    windows = data["shard0_windows_in_gap"]
    assert windows > 0 and data["shard0_windows_fired_late"] + data["shard0_windows_skipped"] == windows
    for other in data["other_shards"]:
        assert other["fires"] > 0
        assert other["longest_pause_ms"] < data["shard0_fire_gap_s"] * 1000  # they went on firing meanwhile
